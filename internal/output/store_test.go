package output

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/bluesky-social/indigo/atproto/atdata"
	"github.com/google/go-cmp/cmp"
)

const (
	runnerA = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	runnerB = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
)

func checkOf(runner, key string) string { return "at://" + runner + "/dev.knotless.check/" + key }

func testStore(t *testing.T, dir string, clock *fakeClock, mod func(*StoreConfig)) *Store {
	t.Helper()
	cfg := StoreConfig{
		Dir: dir, Limits: Limits{Head: 16, Tail: 16, Marks: 10, Subscribers: 10},
		MaxRunsPerRunner: 2, MaxFiles: 2, MaxFileBytes: 10, Retention: time.Hour, Now: clock.Now,
	}
	if mod != nil {
		mod(&cfg)
	}
	st, err := OpenStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func put(t *testing.T, st *Store, runner string, in PutInput) PutOutput {
	t.Helper()
	out, err := st.Put(runner, in)
	if err != nil {
		t.Fatalf("put %+v: %v", in, err)
	}
	return out
}

func readAll(t *testing.T, s *Stream) string {
	t.Helper()
	var b strings.Builder
	off := int64(0)
	for {
		rd, err := s.Read(off, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if rd.Offset > off {
			b.WriteString("[cut]")
		}
		b.Write(rd.Data)
		off = rd.Offset + int64(len(rd.Data))
		if len(rd.Data) == 0 {
			return b.String()
		}
	}
}

// Puts extend the stream from its size: a retry appends nothing twice,
// a put past the size appends nothing and says where to go on, bytes
// the runner cut are recorded as cut, and the final put ends it. The
// store keeps what a runner's stream of the same bounds keeps.
func TestStorePut(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	st := testStore(t, t.TempDir(), clock, nil)
	c := checkOf(runnerA, "k1")
	mark := WireMark{Offset: 0, Time: "2027-01-15T08:00:00.000Z", Kind: MarkStepStart, Name: "build"}
	one := int64(1)
	mark.Step = &one
	if out := put(t, st, runnerA, PutInput{Check: c, Run: "r1", Offset: 0, Data: atdata.Bytes("hello "), Marks: []WireMark{mark}}); out.Size != 6 {
		t.Errorf("size %d after 6 bytes", out.Size)
	}
	// A retry of the same put, and an overlapping one.
	put(t, st, runnerA, PutInput{Check: c, Run: "r1", Offset: 0, Data: atdata.Bytes("hello "), Marks: []WireMark{mark}})
	if out := put(t, st, runnerA, PutInput{Check: c, Run: "r1", Offset: 3, Data: atdata.Bytes("lo world")}); out.Size != 11 {
		t.Errorf("size %d after an overlapping put, want 11", out.Size)
	}
	// Past the size: nothing, and where to go on.
	if out := put(t, st, runnerA, PutInput{Check: c, Run: "r1", Offset: 20, Data: atdata.Bytes("later")}); out.Size != 11 {
		t.Errorf("size %d after a put past it, want 11", out.Size)
	}
	s, _ := st.Stream(c)
	if got := readAll(t, s); got != "hello world" {
		t.Errorf("stream %q", got)
	}
	rd, _ := s.Read(0, 100)
	if len(rd.Marks) != 1 {
		t.Errorf("marks %+v, want the step's once", rd.Marks)
	}
	// The runner cut bytes 11 to 40.
	from := int64(11)
	put(t, st, runnerA, PutInput{Check: c, Run: "r1", Offset: 40, CutFrom: &from, Data: atdata.Bytes("tail")})
	if out := put(t, st, runnerA, PutInput{Check: c, Run: "r1", Offset: 44, Data: atdata.Bytes("!"), Final: true, Status: "success"}); !out.Final || out.Size != 45 {
		t.Errorf("final put: %+v", out)
	}
	if got := readAll(t, s); got != "hello world[cut]tail!" {
		t.Errorf("stream %q", got)
	}
	if final, status := s.Final(); !final || status != "success" {
		t.Errorf("final %v %q", final, status)
	}
	// The same bytes written to a runner's stream of these bounds keep
	// the same log.
	mem := NewStream(c, "r1", st.cfg.Limits)
	_, _ = mem.Write([]byte("0123456789abcdefghijklmnopqrstuvwxyz0123456789"))
	c2 := checkOf(runnerA, "k2")
	put(t, st, runnerA, PutInput{Check: c2, Run: "r", Offset: 0, Data: atdata.Bytes("0123456789abcdefghijklmnopqrstuvwxyz0123456789")})
	s2, _ := st.Stream(c2)
	a, _ := mem.Log()
	b, _ := s2.Log()
	if !bytes.Equal(a, b) {
		t.Errorf("store keeps %q, a runner's stream %q", b, a)
	}
}

// A store opened again has its runs as they were: bytes, marks, files,
// end.
func TestStoreReopen(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	dir := t.TempDir()
	st := testStore(t, dir, clock, nil)
	c := checkOf(runnerA, "k")
	mark := WireMark{Offset: 3, Time: "2027-01-15T08:00:00.000Z", Kind: MarkTime}
	put(t, st, runnerA, PutInput{Check: c, Run: "r", Offset: 0, Data: atdata.Bytes("0123456789abcdefghijklmnopqrstuvwxyz"), Marks: []WireMark{mark}})
	if _, err := st.PutFile(runnerA, c, "r", "out/a.txt", strings.NewReader("abc")); err != nil {
		t.Fatal(err)
	}
	put(t, st, runnerA, PutInput{Check: c, Run: "r", Offset: 36, Final: true, Status: "failure"})
	s, _ := st.Stream(c)
	want := readAll(t, s)
	wantRead, _ := s.Read(0, 100)

	again := testStore(t, dir, clock, nil)
	s2, ok := again.Stream(c)
	if !ok {
		t.Fatal("the run is gone")
	}
	if got := readAll(t, s2); got != want {
		t.Errorf("reopened %q, want %q", got, want)
	}
	gotRead, _ := s2.Read(0, 100)
	if diff := cmp.Diff(wantRead, gotRead); diff != "" {
		t.Errorf("read (-before +after):\n%s", diff)
	}
	if files := again.Files(c); len(files) != 1 || files[0].Path != "out/a.txt" {
		t.Errorf("files %+v", files)
	}
	f, _, err := again.OpenFile(c, "out/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "abc" {
		t.Errorf("file %q", b)
	}
}

func TestStoreBounds(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	st := testStore(t, t.TempDir(), clock, nil)
	a1, a2, a3 := checkOf(runnerA, "1"), checkOf(runnerA, "2"), checkOf(runnerA, "3")
	put(t, st, runnerA, PutInput{Check: a1, Run: "r", Offset: 0, Data: atdata.Bytes("x")})
	put(t, st, runnerA, PutInput{Check: a2, Run: "r", Offset: 0, Data: atdata.Bytes("x")})
	if _, err := st.Put(runnerA, PutInput{Check: a3, Run: "r", Offset: 0}); !errors.Is(err, ErrTooManyRuns) {
		t.Errorf("a third live run of 2: %v", err)
	}
	// Another runner has its own room.
	put(t, st, runnerB, PutInput{Check: checkOf(runnerB, "1"), Run: "r", Offset: 0})
	// An ended run makes room.
	put(t, st, runnerA, PutInput{Check: a1, Run: "r", Offset: 1, Final: true})
	put(t, st, runnerA, PutInput{Check: a3, Run: "r", Offset: 0})
	if _, ok := st.Stream(a1); ok {
		t.Error("the ended run was kept past the bound")
	}

	// A new run of a check replaces its stream; the earlier run is
	// refused from then on.
	put(t, st, runnerA, PutInput{Check: a2, Run: "r2", Offset: 0, Data: atdata.Bytes("new")})
	if _, err := st.Put(runnerA, PutInput{Check: a2, Run: "r", Offset: 1, Data: atdata.Bytes("old")}); !errors.Is(err, ErrRunReplaced) {
		t.Errorf("a put of the replaced run: %v", err)
	}
	if s, _ := st.Stream(a2); readAll(t, s) != "new" {
		t.Error("the stream is not the new run's")
	}

	// Files: at most 2, 10 bytes in all; the same path replaces.
	if _, err := st.PutFile(runnerA, a3, "r", "a", strings.NewReader("12345")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutFile(runnerA, a3, "r", "a", strings.NewReader("1234567")); err != nil {
		t.Errorf("replacing a file: %v", err)
	}
	if _, err := st.PutFile(runnerA, a3, "r", "b", strings.NewReader("1234")); !errors.Is(err, ErrFileTooLarge) {
		t.Errorf("11 bytes of files of 10: %v", err)
	}
	if _, err := st.PutFile(runnerA, a3, "r", "b", strings.NewReader("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.PutFile(runnerA, a3, "r", "c", strings.NewReader("")); !errors.Is(err, ErrTooManyFiles) {
		t.Errorf("a third file of 2: %v", err)
	}
	if _, err := st.PutFile(runnerA, a3, "other", "d", strings.NewReader("")); !errors.Is(err, ErrNotFound) {
		t.Errorf("a file of another run: %v", err)
	}
	for _, p := range []string{"", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/", "a\nb", "..", "report\u202etxt.exe", "a\u2066b", "x\xffy"} {
		if _, err := st.PutFile(runnerA, a3, "r", p, strings.NewReader("")); !errors.Is(err, ErrBadPath) {
			t.Errorf("path %q: %v", p, err)
		}
	}
}

func TestStoreRetention(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	dir := t.TempDir()
	st := testStore(t, dir, clock, func(c *StoreConfig) { c.MaxRunsPerRunner = 10 })
	ended, live, quiet := checkOf(runnerA, "e"), checkOf(runnerA, "l"), checkOf(runnerA, "q")
	put(t, st, runnerA, PutInput{Check: ended, Run: "r", Offset: 0, Final: true})
	put(t, st, runnerA, PutInput{Check: quiet, Run: "r", Offset: 0})
	clock.Add(50 * time.Minute)
	put(t, st, runnerA, PutInput{Check: live, Run: "r", Offset: 0, Data: atdata.Bytes("x")})
	clock.Add(20 * time.Minute)
	st.Sweep()
	for c, kept := range map[string]bool{ended: false, quiet: false, live: true} {
		if _, ok := st.Stream(c); ok != kept {
			t.Errorf("%s kept %v, want %v", c, ok, kept)
		}
	}
	if again := testStore(t, dir, clock, nil); again.Len() != 1 {
		t.Errorf("reopened with %d runs, want the live one", again.Len())
	}
}

// A live run's meta.json is written at most every PersistEvery: a store
// opened after a crash has the run as it was a moment before, and the
// runner's next put tells it to go on from there; Flush writes it all.
func TestStorePersistEvery(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	dir := t.TempDir()
	st := testStore(t, dir, clock, nil)
	c := checkOf(runnerA, "k")
	put(t, st, runnerA, PutInput{Check: c, Run: "r", Offset: 0, Data: atdata.Bytes("one ")})
	put(t, st, runnerA, PutInput{Check: c, Run: "r", Offset: 4, Data: atdata.Bytes("two ")})
	crashed := testStore(t, dir, clock, nil) // as if the first had died now
	s, _ := crashed.Stream(c)
	if s.Size() != 0 {
		t.Errorf("a crash at once keeps %d bytes, want what meta.json had (0)", s.Size())
	}
	if out := put(t, crashed, runnerA, PutInput{Check: c, Run: "r", Offset: 8, Data: atdata.Bytes("three")}); out.Size != 0 {
		t.Errorf("a put past what survived: size %d, want 0 (the runner rewinds)", out.Size)
	}
	clock.Add(PersistEvery)
	put(t, st, runnerA, PutInput{Check: c, Run: "r", Offset: 8, Data: atdata.Bytes("three ")})
	if s, _ := testStore(t, dir, clock, nil).Stream(c); readAll(t, s) != "one two three " {
		t.Errorf("after PersistEvery: %q", readAll(t, s))
	}
	put(t, st, runnerA, PutInput{Check: c, Run: "r", Offset: 14, Data: atdata.Bytes("four")})
	if err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	if s, _ := testStore(t, dir, clock, nil).Stream(c); readAll(t, s) != "one two three four" {
		t.Errorf("after Flush: %q", readAll(t, s))
	}
}
