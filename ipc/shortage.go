package ipc

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// FDLimit is the process's soft RLIMIT_NOFILE (0 if it cannot be read):
// what bounds a daemon's connections and segments, each an fd.
func FDLimit() uint64 {
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return l.Cur
}

// ownShortage is what to add to a request's error when err is the
// daemon's own shortage of fds (EMFILE, or ENFILE for the whole system)
// or of mappings or memory (ENOMEM from mmap), which the client did
// nothing to cause; it is logged, as the operator must raise the limit.
// "" for any other cause.
func (s *Session) ownShortage(err error) string {
	switch {
	case errors.Is(err, unix.ENOMEM):
		s.log.Warn("this daemon could not map a segment: out of memory, or vm.max_map_count reached", "err", err)
		return " (the daemon could not map it: out of memory, or vm.max_map_count reached)"
	case errors.Is(err, unix.EMFILE):
		s.log.Warn("this daemon is out of file descriptors", "rlimit_nofile", FDLimit(), "err", err)
		return fmt.Sprintf(" (the daemon is out of file descriptors, its limit %d)", FDLimit())
	case errors.Is(err, unix.ENFILE):
		s.log.Warn("the system is out of file descriptors", "err", err)
		return " (the system is out of file descriptors)"
	}
	return ""
}
