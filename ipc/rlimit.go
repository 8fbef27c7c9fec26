package ipc

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// nofileLimit is the process's soft RLIMIT_NOFILE, for errors that say a
// daemon ran out of fds (0 if it cannot be read).
func nofileLimit() uint64 {
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return l.Cur
}

// shortOfFDs is what to add to a request's error when err is the
// daemon's own shortage of fds (EMFILE, or ENFILE for the whole system),
// which the client did nothing to cause; it is logged, as the operator
// must raise the limit. "" for any other cause.
func (s *Session) shortOfFDs(err error) string {
	switch {
	case errors.Is(err, unix.EMFILE):
		s.log.Warn("this daemon is out of file descriptors", "rlimit_nofile", nofileLimit(), "err", err)
		return fmt.Sprintf(" (the daemon is out of file descriptors, its limit %d)", nofileLimit())
	case errors.Is(err, unix.ENFILE):
		s.log.Warn("the system is out of file descriptors", "err", err)
		return " (the system is out of file descriptors)"
	}
	return ""
}
