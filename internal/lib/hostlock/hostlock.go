// Package hostlock holds a name on this host for as long as the process
// lives: a Linux abstract unix socket, bound and listened on. The kernel
// frees the name when the process dies, however it dies (kill -9
// included), and the socket is close-on-exec, so no process the holder
// starts keeps it. A second taker is refused with what the holder says
// of itself and the holder's pid and uid as the kernel tells them
// (SO_PEERCRED), which the holder cannot make up.
//
// The names are those of the network namespace: a process in another
// one (a container, a unit with PrivateNetwork=) or on another host is
// not seen, and any process of the namespace can take a name first.
package hostlock

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// ErrUnsupported is a system without abstract unix sockets (not Linux).
var ErrUnsupported = errors.New("hostlock: abstract unix sockets are Linux's")

// Lock is a name held.
type Lock struct {
	l  net.Listener
	wg sync.WaitGroup
}

// HeldError is a name another live process holds.
type HeldError struct {
	Name string
	// PID and UID are the holder's, from the kernel (0 and -1 when it
	// would not tell them).
	PID, UID int
	// Said is what the holder answered about itself (at most 4 KiB;
	// empty if it did not answer within a second).
	Said []byte
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%s is held by pid %d (uid %d)", e.Name, e.PID, e.UID)
}

// Take holds name (an abstract socket "@"+name) until Release, and
// answers each process that asks with said.
func Take(name string, said []byte) (*Lock, error) {
	if !supported {
		return nil, ErrUnsupported
	}
	l, err := net.Listen("unix", "@"+name)
	if err != nil {
		if held := asked(name); held != nil {
			return nil, held
		}
		return nil, fmt.Errorf("hold %s: %w", name, err)
	}
	lk := &Lock{l: l}
	lk.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write(said)
			c.Close()
		}
	})
	return lk, nil
}

// asked asks the holder of name who it is: nil if nothing answers
// (the name was not held after all).
func asked(name string) *HeldError {
	c, err := net.DialTimeout("unix", "@"+name, time.Second)
	if err != nil {
		return nil
	}
	defer c.Close()
	held := &HeldError{Name: name, UID: -1}
	held.PID, held.UID = peer(c.(*net.UnixConn))
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	held.Said, _ = io.ReadAll(io.LimitReader(c, 4096))
	return held
}

// Release lets the name go and waits for the answering goroutine.
func (l *Lock) Release() error {
	err := l.l.Close()
	l.wg.Wait()
	return err
}
