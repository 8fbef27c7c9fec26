package shm

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openFds counts this process's open fds.
func openFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestCreateSealsAndRounds(t *testing.T) {
	base := openFds(t)
	s, err := Create(100)
	if err != nil {
		t.Fatal(err)
	}
	pg := int64(os.Getpagesize())
	if s.Size() != pg || len(s.Bytes()) != int(pg) {
		t.Fatalf("size %d, mapping %d, want %d", s.Size(), len(s.Bytes()), pg)
	}
	seals, err := unix.FcntlInt(uintptr(s.Fd()), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL; seals != want {
		t.Errorf("seals 0x%x, want 0x%x", seals, want)
	}
	if err := unix.Ftruncate(s.Fd(), 10); !errors.Is(err, unix.EPERM) {
		t.Errorf("shrinking a sealed memfd: %v, want EPERM", err)
	}
	if err := unix.Ftruncate(s.Fd(), 2*pg); !errors.Is(err, unix.EPERM) {
		t.Errorf("growing a sealed memfd: %v, want EPERM", err)
	}
	if flags, _ := unix.FcntlInt(uintptr(s.Fd()), unix.F_GETFD, 0); flags&unix.FD_CLOEXEC == 0 {
		t.Error("memfd is not close-on-exec")
	}
	// The mapping is shared: a second mapping of the fd sees writes.
	s.Bytes()[7] = 42
	other, err := unix.Mmap(s.Fd(), 0, int(pg), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	if other[7] != 42 {
		t.Error("write not visible through a second shared mapping")
	}
	unix.Munmap(other)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if n := openFds(t); n != base {
		t.Errorf("%d fds open after Close, %d before", n, base)
	}
	for _, bad := range []int64{0, -1, math.MaxInt64} {
		if _, err := Create(bad); err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("Create(%d): %v", bad, err)
		}
	}
}

// sealedMemfd makes a client-style memfd of size bytes with the given seals.
func sealedMemfd(t *testing.T, size int64, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("client", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

func fdClosed(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return errors.Is(err, unix.EBADF)
}

func TestImport(t *testing.T) {
	base := openFds(t)
	fd := sealedMemfd(t, 5000, unix.F_SEAL_SHRINK)
	s, err := Import(fd, 5000)
	if err != nil {
		t.Fatal(err)
	}
	if s.Size() != 5000 || len(s.Bytes()) != 5000 {
		t.Errorf("size %d, mapping %d", s.Size(), len(s.Bytes()))
	}
	s.Bytes()[4999] = 1
	s.Close()

	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[1])
	zero, err := unix.Open("/dev/zero", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "regular")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		fd   int
		size int64
		want error
		text string
	}{
		{"pipe", p[0], 4096, ErrNotMemfd, "pipe:"},
		{"/dev/zero", zero, 4096, ErrNotMemfd, "/dev/zero"},
		{"regular file", reg, 4096, ErrNotMemfd, "regular"},
		{"unsealed memfd", sealedMemfd(t, 4096, 0), 4096, ErrUnsealed, "seals 0x0"},
		{"grow-only sealed memfd", sealedMemfd(t, 4096, unix.F_SEAL_GROW), 4096, ErrUnsealed, "F_SEAL_SHRINK"},
		{"wrong size", sealedMemfd(t, 4096, unix.F_SEAL_SHRINK), 8192, ErrSize, "4096 bytes, client said 8192"},
		{"size 0", sealedMemfd(t, 0, unix.F_SEAL_SHRINK), 0, ErrSize, "cannot be mapped"},
		{"write-sealed memfd", sealedMemfd(t, 4096, unix.F_SEAL_SHRINK|unix.F_SEAL_WRITE), 4096, nil, "mmap"},
	}
	for _, c := range cases {
		_, err := Import(c.fd, c.size)
		if err == nil {
			t.Errorf("%s: imported", c.name)
			continue
		}
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if !strings.Contains(err.Error(), c.text) || !strings.Contains(err.Error(), "fd ") {
			t.Errorf("%s: error %q does not name the fd and %q", c.name, err, c.text)
		}
		if !fdClosed(c.fd) {
			t.Errorf("%s: fd %d left open", c.name, c.fd)
		}
		// Errors name which check failed, and only that one.
		for _, other := range []error{ErrNotMemfd, ErrUnsealed, ErrSize} {
			if other != c.want && errors.Is(err, other) {
				t.Errorf("%s: %v also matches %v", c.name, err, other)
			}
		}
	}
	if _, err := Import(-1, 1); !errors.Is(err, ErrNotMemfd) {
		t.Errorf("Import(-1): %v", err)
	}
	unix.Close(p[1])
	p[1] = -1
	if n := openFds(t); n != base {
		t.Errorf("%d fds open at the end, %d at the start", n, base)
	}
}

func TestTable(t *testing.T) {
	base := openFds(t)
	pg := int64(os.Getpagesize())
	tab := NewTable(3*pg, 1024)
	mk := func(n int64) *Segment {
		s, err := Create(n)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := mk(pg), mk(2*pg)
	ida, err := tab.Add(a)
	if err != nil || ida == 0 {
		t.Fatalf("Add: %d %v", ida, err)
	}
	idb, err := tab.Add(b)
	if err != nil || idb == ida {
		t.Fatalf("Add: %d %v", idb, err)
	}
	if tab.Held() != 3*pg {
		t.Errorf("Held %d", tab.Held())
	}
	c := mk(1)
	if _, err := tab.Add(c); !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "held") {
		t.Errorf("over quota: %v", err)
	}
	if err := tab.Reserve(1); !errors.Is(err, ErrQuota) {
		t.Errorf("Reserve over quota: %v", err)
	}
	c.Close()

	buf, release, err := tab.Acquire(idb, 100, 200)
	if err != nil || len(buf) != 200 || cap(buf) != 200 {
		t.Fatalf("Acquire: %d %v", len(buf), err)
	}
	buf[0] = 9
	if b.Bytes()[100] != 9 {
		t.Error("acquired range does not alias the segment")
	}
	if err := tab.Free(idb); !errors.Is(err, ErrBusy) {
		t.Errorf("Free while referenced: %v", err)
	}
	release()
	for _, r := range []struct{ off, n uint64 }{{0, uint64(2*pg) + 1}, {uint64(2 * pg), 1}, {1 << 63, 1 << 63}, {uint64(2*pg) + 1, 0}} {
		if _, _, err := tab.Acquire(idb, r.off, r.n); !errors.Is(err, ErrRange) {
			t.Errorf("Acquire(%d, %d): %v, want ErrRange", r.off, r.n, err)
		}
	}
	if _, rel, err := tab.Acquire(idb, uint64(2*pg), 0); err != nil {
		t.Errorf("empty range at the end: %v", err)
	} else {
		rel()
	}
	if _, _, err := tab.Acquire(99, 0, 1); !errors.Is(err, ErrBadSegment) {
		t.Errorf("Acquire unknown: %v", err)
	}
	if err := tab.Free(idb); err != nil {
		t.Errorf("Free: %v", err)
	}
	if err := tab.Free(idb); !errors.Is(err, ErrBadSegment) {
		t.Errorf("double Free: %v", err)
	}
	if tab.Held() != pg {
		t.Errorf("Held after Free %d", tab.Held())
	}

	// Close with an outstanding reference: the segment stays mapped and
	// usable until released.
	buf, release, err = tab.Acquire(ida, 0, uint64(pg))
	if err != nil {
		t.Fatal(err)
	}
	tab.Close()
	tab.Close()
	if tab.Len() != 0 || tab.Held() != 0 {
		t.Errorf("after Close: %d segments, %d bytes", tab.Len(), tab.Held())
	}
	buf[pg-1] = 1 // still mapped
	if fdClosed(a.Fd()) {
		t.Error("referenced segment closed early")
	}
	if _, err := tab.Add(mk(1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Add after Close: %v", err)
	}
	release()
	if n := openFds(t); n != base+1 { // the segment refused after Close is ours
		t.Errorf("%d fds open, want %d", n, base+1)
	}
}

func TestTableFdsBackToBaseline(t *testing.T) {
	base := openFds(t)
	tab := NewTable(1<<30, 1024)
	var releases []func()
	for i := 0; i < 50; i++ {
		s, err := Create(int64(1000 * (i + 1)))
		if err != nil {
			t.Fatal(err)
		}
		id, err := tab.Add(s)
		if err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 {
			_, rel, err := tab.Acquire(id, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			releases = append(releases, rel)
		}
	}
	if n := openFds(t); n != base+50 {
		t.Errorf("%d fds with 50 segments, baseline %d", n, base)
	}
	tab.Close()
	for _, r := range releases {
		r()
	}
	if n := openFds(t); n != base {
		t.Errorf("%d fds after everything was freed, baseline %d", n, base)
	}
}

func TestAcquireDoesNotAllocate(t *testing.T) {
	tab := NewTable(1<<20, 1024)
	s, _ := Create(4096)
	id, _ := tab.Add(s)
	defer tab.Close()
	n := testing.AllocsPerRun(100, func() {
		_, rel, err := tab.Acquire(id, 8, 64)
		if err != nil {
			panic(err)
		}
		rel()
	})
	if n != 0 {
		t.Errorf("Acquire+release allocates %v times", n)
	}
}

// A table holds at most its count of segments, however small they are:
// the next is refused by Reserve and Add alike (the quota error, naming
// the count), and freeing one makes room again.
func TestTableSegmentLimit(t *testing.T) {
	tab := NewTable(1<<30, 2)
	defer tab.Close()
	var ids []uint32
	for range 2 {
		s, err := Create(1)
		if err != nil {
			t.Fatal(err)
		}
		id, err := tab.Add(s)
		if err != nil {
			t.Fatalf("Add within the limit: %v", err)
		}
		ids = append(ids, id)
	}
	if err := tab.Reserve(1); !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "2 segments held") {
		t.Fatalf("Reserve with 2 of 2 segments held: %v, want ErrQuota naming the count", err)
	}
	s, err := Create(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Add(s); !errors.Is(err, ErrQuota) {
		s.Close()
		t.Fatalf("Add of a third segment: %v, want ErrQuota", err)
	}
	if err := tab.Free(ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := tab.Add(s); err != nil {
		t.Fatalf("Add after a Free: %v", err)
	}
}
