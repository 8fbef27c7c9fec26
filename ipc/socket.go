package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// ErrSocketInUse means a live daemon answers on the socket path.
var ErrSocketInUse = errors.New("socket in use by a running daemon")

// socketDirMode is the mode of a socket directory Listen creates: the
// owner and the group may reach the socket, others may not.
const socketDirMode = 0o750

// probeTimeout bounds the connect that tells a live socket from a stale one.
const probeTimeout = time.Second

// maxSocketPath is the longest path sockaddr_un holds (108 with the NUL).
const maxSocketPath = 107

// listenSocket binds a Unix socket at path with the given mode. The
// directory is created (mode 0750) if missing. A socket left by a crashed
// daemon (connect refused) is replaced; a live one is not (ErrSocketInUse);
// anything else at path is left alone and reported.
//
// The socket is bound under a temporary name in the same directory, given
// its mode, then renamed over path, so that it is never reachable with the
// umask's permissions and replacing a stale socket is atomic.
func listenSocket(path string, mode os.FileMode) (*net.UnixListener, os.FileInfo, error) {
	if len(path) > maxSocketPath {
		return nil, nil, fmt.Errorf("ipc: socket path %s is %d bytes, the limit is %d", path, len(path), maxSocketPath)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, socketDirMode); err != nil {
		return nil, nil, fmt.Errorf("ipc: socket directory %s: %w", dir, err)
	}
	if err := checkStale(path); err != nil {
		return nil, nil, err
	}
	tmp := filepath.Join(dir, "."+filepath.Base(path)+"."+strconv.Itoa(os.Getpid()))
	if len(tmp) > maxSocketPath {
		tmp = path // no room for a temporary name: bind in place
	}
	os.Remove(tmp) // ours from an earlier run with the same pid, if any
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("ipc: listen on %s: %w", path, err)
	}
	l.SetUnlinkOnClose(false) // the file moves; Server.Close removes it
	fail := func(err error) (*net.UnixListener, os.FileInfo, error) {
		l.Close()
		os.Remove(tmp)
		return nil, nil, err
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return fail(fmt.Errorf("ipc: chmod socket %s to %v: %w", path, mode, err))
	}
	if err := os.Rename(tmp, path); tmp != path && err != nil {
		return fail(fmt.Errorf("ipc: place socket at %s: %w", path, err))
	}
	fi, err := os.Lstat(path)
	if err != nil {
		l.Close()
		return nil, nil, fmt.Errorf("ipc: stat socket %s: %w", path, err)
	}
	return l, fi, nil
}

// checkStale clears path for a new socket or explains why it cannot.
func checkStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("ipc: socket path %s: %w", path, err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("ipc: socket path %s exists and is not a socket (%v); not replacing it", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, probeTimeout)
	if err == nil {
		held := answering(c)
		c.Close()
		return fmt.Errorf("ipc: %s: %w (held by %s)", path, ErrSocketInUse, held)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("ipc: socket %s: cannot tell whether a daemon is listening: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("ipc: remove stale socket %s: %w", path, err)
	}
	return nil
}

// removeSocket removes path if it is still the socket we created (another
// daemon may have replaced it since).
func removeSocket(path string, ours os.FileInfo) error {
	fi, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("ipc: remove socket %s: %w", path, err)
	}
	if !os.SameFile(fi, ours) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("ipc: remove socket %s: %w", path, err)
	}
	return nil
}
