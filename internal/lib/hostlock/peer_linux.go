package hostlock

import (
	"net"
	"syscall"
)

const supported = true

// peer is the pid and uid of the process at the other end of c, as the
// kernel recorded them when it listened.
func peer(c *net.UnixConn) (pid, uid int) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, -1
	}
	pid, uid = 0, -1
	_ = raw.Control(func(fd uintptr) {
		cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		if err == nil {
			pid, uid = int(cred.Pid), int(cred.Uid)
		}
	})
	return pid, uid
}
