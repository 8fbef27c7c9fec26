package localworld

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// PortRangeFile is where the kernel keeps the ephemeral port range: the
// source ports of outgoing connections, and of listeners bound to port 0.
const PortRangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// MinPort is the lowest port a local world takes. Below it live the
// well-known and registered services a developer's machine may run.
const MinPort = 20000

// pickTries bounds the random draws for one port, so that a machine whose
// candidate ports are all taken gets an error instead of a spin.
const pickTries = 200

// EphemeralRange reads the kernel's ephemeral port range.
func EphemeralRange() (lo, hi int, err error) {
	b, err := os.ReadFile(PortRangeFile)
	if err != nil {
		return 0, 0, fmt.Errorf("localworld: ephemeral port range: %w", err)
	}
	return parseRange(string(b))
}

func parseRange(s string) (lo, hi int, err error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("localworld: %s holds %q, want two ports", PortRangeFile, s)
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err := errors.Join(err1, err2); err != nil || lo < 1 || hi > 65535 || lo > hi {
		return 0, 0, fmt.Errorf("localworld: %s holds %q, want two ports lo <= hi in [1, 65535]: %v", PortRangeFile, s, err)
	}
	return lo, hi, nil
}

// span is an inclusive range of candidate ports.
type span struct{ lo, hi int }

// candidates are the ports from MinPort up that the kernel never hands out
// by itself: below the ephemeral range and above it.
func candidates(lo, hi int) []span {
	var c []span
	if lo-1 >= MinPort {
		c = append(c, span{MinPort, lo - 1})
	}
	if hi+1 <= 65535 {
		c = append(c, span{max(hi+1, MinPort), 65535})
	}
	return c
}

func (c span) size() int { return c.hi - c.lo + 1 }

// draw picks a candidate port uniformly at random.
func draw(spans []span) int {
	total := 0
	for _, s := range spans {
		total += s.size()
	}
	n := rand.IntN(total)
	for _, s := range spans {
		if n < s.size() {
			return s.lo + n
		}
		n -= s.size()
	}
	panic("unreachable")
}

// Listeners binds n TCP listeners on 127.0.0.1, each on a different port
// outside the kernel's ephemeral range (see FreePorts for why), and hands
// them over open: the caller closes them.
func Listeners(n int) ([]net.Listener, error) {
	lo, hi, err := EphemeralRange()
	if err != nil {
		return nil, err
	}
	spans := candidates(lo, hi)
	if len(spans) == 0 {
		return nil, fmt.Errorf("localworld: no ports from %d to 65535 lie outside the ephemeral range %d-%d (%s); "+
			"this is the machine's setting, not a bug: narrow it, e.g. sysctl -w net.ipv4.ip_local_port_range=\"32768 60999\"",
			MinPort, lo, hi, PortRangeFile)
	}
	var ls []net.Listener
	for len(ls) < n {
		l, err := listenOne(spans, lo, hi)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// listenOne draws ports until one binds. Only EADDRINUSE is worth another
// draw: any other failure would fail for every port.
func listenOne(spans []span, lo, hi int) (net.Listener, error) {
	var last error
	for range pickTries {
		p := draw(spans)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			return l, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("localworld: listen on 127.0.0.1:%d: %w", p, err)
		}
		last = err
	}
	return nil, fmt.Errorf("localworld: %d random ports in %v (outside the ephemeral range %d-%d) were all in use; "+
		"this is the machine, not a bug: stop what holds them, or lower the ephemeral range's low bound in %s to widen %d-%d: %w",
		pickTries, spans, lo, hi, PortRangeFile, MinPort, lo-1, last)
}

// FreePorts returns n different TCP ports free on 127.0.0.1 just now, for a
// world's daemons to bind.
//
// They come from outside the kernel's ephemeral range (read, not assumed):
// ports from inside it are the source ports of every outgoing connection,
// so a daemon dialling its peer, or another test, could be given the very
// port a daemon is about to bind. Outside it nothing takes a port but an
// explicit bind. Each is drawn at random, so that concurrent worlds seldom
// draw the same, and bound once to check that it is free. Every local
// world (tests, bench, demo, soak) takes its ports here.
func FreePorts(n int) ([]int, error) {
	ls, err := Listeners(n)
	if err != nil {
		return nil, err
	}
	ports := make([]int, n)
	for i, l := range ls {
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	return ports, nil
}
