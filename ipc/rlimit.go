package ipc

import "golang.org/x/sys/unix"

// nofileLimit is the process's soft RLIMIT_NOFILE, for errors that say a
// daemon ran out of fds (0 if it cannot be read).
func nofileLimit() uint64 {
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &l) != nil {
		return 0
	}
	return l.Cur
}
