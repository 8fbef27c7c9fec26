package fdtest

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// ConnectWhileFull connects to a listener ("unix" with a path, or "tcp"
// with an IPv4 host:port) while the process's fd table is full, so that
// the listener's accept fails with EMFILE: the socket is made first and
// connected after Exhaust (connect takes no new fd). It keeps the table
// full until seen returns true or within has passed, then frees it and
// returns the connection, still waiting in the listener's backlog or
// accepted since.
func ConnectWhileFull(network, addr string, seen func() bool, within time.Duration) (net.Conn, error) {
	var sa unix.Sockaddr
	family := unix.AF_UNIX
	switch network {
	case "unix":
		sa = &unix.SockaddrUnix{Name: addr}
	case "tcp":
		ta, err := net.ResolveTCPAddr("tcp4", addr)
		if err != nil {
			return nil, fmt.Errorf("fdtest: %w", err)
		}
		in4 := &unix.SockaddrInet4{Port: ta.Port}
		copy(in4.Addr[:], ta.IP.To4())
		sa, family = in4, unix.AF_INET
	default:
		return nil, fmt.Errorf("fdtest: network %q, want unix or tcp", network)
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fdtest: socket: %w", err)
	}
	f := os.NewFile(uintptr(fd), "fdtest "+network+" "+addr)
	defer f.Close() // net.FileConn holds a duplicate
	release, err := Exhaust()
	if err != nil {
		return nil, err
	}
	err = unix.Connect(fd, sa)
	for deadline := time.Now().Add(within); err == nil && !seen() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	release()
	if err != nil {
		return nil, fmt.Errorf("fdtest: connect to %s with the fd table full: %w", addr, err)
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("fdtest: %w", err)
	}
	return c, nil
}
