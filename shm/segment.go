package shm

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Sentinel errors of Import, wrapped by errors that name the fd and the
// failed check.
var (
	ErrNotMemfd = errors.New("not a memfd")
	ErrUnsealed = errors.New("memfd not sealed with F_SEAL_SHRINK")
	ErrSize     = errors.New("memfd size mismatch")
)

// Segment is one mapped memfd.
type Segment struct {
	once sync.Once
	fd   int
	mem  []byte
	size int64
	err  error
}

// PageRound rounds n up to a multiple of the page size; ok is false if n is
// not positive or the result overflows.
func PageRound(n int64) (int64, bool) {
	pg := int64(os.Getpagesize())
	if n <= 0 || n > math.MaxInt64-pg+1 {
		return 0, false
	}
	return (n + pg - 1) &^ (pg - 1), true
}

// Create makes a memfd of size rounded up to the page size, seals it
// against shrinking, growing and further sealing, and maps it shared
// read-write.
func Create(size int64) (*Segment, error) {
	rounded, ok := PageRound(size)
	if !ok || rounded > math.MaxInt {
		return nil, fmt.Errorf("shm: create: size %d out of range", size)
	}
	fd, err := unix.MemfdCreate("collectived", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shm: create: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, rounded); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: create: ftruncate memfd to %d bytes: %w", rounded, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: create: seal memfd: %w", err)
	}
	return mapFd(fd, rounded, "create")
}

// Import takes ownership of fd (closing it on error) and maps it, after
// checking that it is a memfd (F_GET_SEALS succeeds), is sealed with
// F_SEAL_SHRINK, and has exactly size bytes.
func Import(fd int, size int64) (*Segment, error) {
	if fd < 0 {
		return nil, fmt.Errorf("shm: import fd %d: %w: invalid descriptor", fd, ErrNotMemfd)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		kind := describeFd(fd)
		unix.Close(fd)
		return nil, fmt.Errorf("shm: import fd %d (%s): %w: F_GET_SEALS failed: %v", fd, kind, ErrNotMemfd, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		kind := describeFd(fd)
		unix.Close(fd)
		if !strings.HasPrefix(kind, "/memfd:") && kind != "unknown" {
			// A tmpfs file answers F_GET_SEALS too, but can never be sealed.
			return nil, fmt.Errorf("shm: import fd %d (%s): %w: a file that cannot be sealed", fd, kind, ErrNotMemfd)
		}
		return nil, fmt.Errorf("shm: import fd %d (%s): %w (seals 0x%x)", fd, kind, ErrUnsealed, seals)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: import fd %d: fstat: %w", fd, err)
	}
	if st.Size != size {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: import fd %d: %w: memfd has %d bytes, client said %d", fd, ErrSize, st.Size, size)
	}
	if size <= 0 || size > math.MaxInt {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: import fd %d: %w: size %d cannot be mapped", fd, ErrSize, size)
	}
	return mapFd(fd, size, "import")
}

// describeFd names what fd refers to for error messages, e.g. "pipe:[123]",
// "/dev/zero" or "/memfd:x (deleted)".
func describeFd(fd int) string {
	s, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return "unknown"
	}
	return s
}

func mapFd(fd int, size int64, what string) (*Segment, error) {
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: %s: mmap fd %d (%d bytes) shared read-write: %w", what, fd, size, err)
	}
	return &Segment{fd: fd, mem: mem, size: size}, nil
}

// Bytes is the mapping; it must not be used after Close.
func (s *Segment) Bytes() []byte { return s.mem }

// Size is the segment's length in bytes.
func (s *Segment) Size() int64 { return s.size }

// Fd is the memfd; it is owned by the Segment and closed by Close.
func (s *Segment) Fd() int { return s.fd }

// Close unmaps the segment and closes its fd. It is idempotent and returns
// the first error of the first call.
func (s *Segment) Close() error {
	s.once.Do(func() {
		if err := unix.Munmap(s.mem); err != nil {
			s.err = fmt.Errorf("shm: munmap fd %d: %w", s.fd, err)
		}
		if err := unix.Close(s.fd); err != nil && s.err == nil {
			s.err = fmt.Errorf("shm: close fd %d: %w", s.fd, err)
		}
		s.mem = nil
	})
	return s.err
}
