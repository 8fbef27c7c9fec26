package fdtest

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Exhaust lowers RLIMIT_NOFILE's soft limit to a few above the highest fd
// open now and opens /dev/null until the table is full, so the next
// open, dup or accept fails with EMFILE. release closes those fds and
// restores the limit; call it as soon as the step under test is done,
// and keep the test serial (not t.Parallel): every goroutine of the
// process shares the table.
func Exhaust() (release func(), err error) { return ExhaustLeaving(0) }

// ExhaustLeaving is Exhaust with n fds left free: enough for the next n
// opens (a peer's socket, a segment made elsewhere in the process) and
// none after.
func ExhaustLeaving(n int) (release func(), err error) {
	top, err := highestFD()
	if err != nil {
		return nil, err
	}
	restore, err := LowerLimit(uint64(top) + 8)
	if err != nil {
		return nil, err
	}
	var fds []int
	release = func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
		restore()
	}
	for {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.EMFILE) {
			if n > len(fds) {
				release()
				return nil, fmt.Errorf("fdtest: only %d fds were free, want %d left", len(fds), n)
			}
			for range n {
				unix.Close(fds[len(fds)-1])
				fds = fds[:len(fds)-1]
			}
			return release, nil
		}
		if err != nil {
			release()
			return nil, fmt.Errorf("fdtest: open /dev/null: %w", err)
		}
		fds = append(fds, fd)
	}
}

// LowerLimit sets RLIMIT_NOFILE's soft limit to soft, which must not be
// above it already; restore puts the old limit back.
func LowerLimit(soft uint64) (restore func(), err error) {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &old); err != nil {
		return nil, fmt.Errorf("fdtest: getrlimit: %w", err)
	}
	if soft > old.Cur {
		return nil, fmt.Errorf("fdtest: soft limit %d wanted, already %d", soft, old.Cur)
	}
	low := old
	low.Cur = soft
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		return nil, fmt.Errorf("fdtest: setrlimit: %w", err)
	}
	return func() { _ = unix.Setrlimit(unix.RLIMIT_NOFILE, &old) }, nil
}

// highestFD is the largest fd the process has open.
func highestFD() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, fmt.Errorf("fdtest: %w", err)
	}
	top := 0
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			top = max(top, n)
		}
	}
	return top, nil
}
