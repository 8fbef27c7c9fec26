package ipc

import (
	"fmt"
	"net"
	"slices"

	"golang.org/x/sys/unix"
)

// Cred is what the kernel says about the process at the other end of a
// Unix socket (SO_PEERCRED), as it was at connect time.
type Cred struct {
	PID int32
	UID uint32
	GID uint32
}

// PeerCred reads the peer's credentials.
func PeerCred(uc *net.UnixConn) (Cred, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("ipc: peer credentials: %w", err)
	}
	var uc2 *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		uc2, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("ipc: peer credentials: %w", err)
	}
	if gerr != nil {
		return Cred{}, fmt.Errorf("ipc: peer credentials: SO_PEERCRED: %w", gerr)
	}
	return Cred{PID: uc2.Pid, UID: uc2.Uid, GID: uc2.Gid}, nil
}

// allowed applies the ServerConfig rule: root and the daemon's own uid
// always; then any uid in uids; then any peer whose primary gid is in gids
// (SO_PEERCRED shows no supplementary groups).
func allowed(c Cred, self uint32, uids, gids []uint32) bool {
	if c.UID == 0 || c.UID == self {
		return true
	}
	return slices.Contains(uids, c.UID) || slices.Contains(gids, c.GID)
}
