// Package sockowner says, best effort, which process holds a TCP port or
// a Unix socket, for the errors a daemon gives when it cannot bind. It
// reads /proc (net/tcp, net/tcp6 and every process's fds it may read), so
// it finds only what this user may see; what it cannot find it calls
// "unknown" with the reason, never an error: the bind failure it explains
// is the error.
package sockowner
