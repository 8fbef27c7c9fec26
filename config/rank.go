package config

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// ResolveRank returns this node's rank. An override >= 0 (a --rank flag)
// wins over the file; -1 means none. A fixed rank is returned as is. With
// rank auto, the rank is the index of the unique peer whose host resolves
// to an address on one of this machine's interfaces (net.InterfaceAddrs);
// any 127/8 or ::1 address counts as local, as Linux routes all of them to
// lo. None or several matching is an error listing the candidates and the
// local addresses, wrapping ErrNoLocalPeer or ErrAmbiguousRank.
//
// Auto is meant for one daemon per machine with routable peer addresses.
// With an all-loopback peer list (every daemon on one machine) every peer
// is local, so auto fails as ambiguous: give each daemon its rank (rank: in
// its own file, or the override).
//
// Host names are resolved with the system resolver, bounded by
// Timeouts.Connect; IP literals and "localhost" are never looked up.
func (c *Config) ResolveRank(override int) (int, error) {
	if override < -1 {
		return 0, &Error{Source: c.Source(), Key: "rank", Err: fmt.Errorf("override %d is not a rank (-1 means none)", override)}
	}
	n := len(c.Peers)
	if n == 0 {
		return 0, c.errAt("peers", fmt.Errorf("no peers"))
	}
	if override >= 0 {
		if override >= n {
			return 0, &Error{Source: c.Source(), Key: "rank", Err: fmt.Errorf("override %d is out of range: %d peers give ranks 0 to %d", override, n, n-1)}
		}
		return override, nil
	}
	if !c.Rank.Auto {
		if c.Rank.Index < 0 || c.Rank.Index >= n {
			return 0, c.errAt("rank", fmt.Errorf("%d is out of range: %d peers give ranks 0 to %d", c.Rank.Index, n, n-1))
		}
		return c.Rank.Index, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return 0, c.errAt("rank", fmt.Errorf("auto: listing local interface addresses: %w", err))
	}
	local := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			local = append(local, p.Addr().Unmap())
		} else if ip, err := netip.ParseAddr(a.String()); err == nil {
			local = append(local, ip.Unmap())
		}
	}
	timeout := c.Timeouts.Connect
	if timeout <= 0 {
		timeout = DefaultConnect
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.autoRank(local, func(host string) ([]netip.Addr, error) {
		return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	})
}

// autoRank matches peers against local addresses; lookup resolves names
// that are neither IP literals nor localhost.
func (c *Config) autoRank(local []netip.Addr, lookup func(string) ([]netip.Addr, error)) (int, error) {
	isLocal := func(a netip.Addr) bool {
		a = a.Unmap()
		if a.IsLoopback() {
			return true
		}
		for _, l := range local {
			if l == a {
				return true
			}
		}
		return false
	}
	var matches, problems []string
	rank := -1
	for i, peer := range c.Peers {
		host, _, err := net.SplitHostPort(peer)
		if err != nil {
			problems = append(problems, fmt.Sprintf("peers[%d] %q is not host:port", i, peer))
			continue
		}
		var ips []netip.Addr
		if a, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{a}
		} else if isLoopbackHost(host) {
			ips = []netip.Addr{netip.IPv6Loopback()}
		} else if ips, err = lookup(host); err != nil {
			problems = append(problems, fmt.Sprintf("peers[%d] %q does not resolve: %v", i, peer, err))
			continue
		}
		for _, a := range ips {
			if isLocal(a) {
				matches = append(matches, fmt.Sprintf("peers[%d] %s (%s)", i, peer, a))
				rank = i
				break
			}
		}
	}
	switch len(matches) {
	case 1:
		return rank, nil
	case 0:
		ls := make([]string, len(local))
		for i, a := range local {
			ls[i] = a.String()
		}
		extra := ""
		if len(problems) > 0 {
			extra = "; " + strings.Join(problems, "; ")
		}
		return 0, c.errAt("rank", fmt.Errorf("auto: %w (this machine has %s)%s; set rank: or pass the rank override",
			ErrNoLocalPeer, strings.Join(ls, ", "), extra))
	default:
		return 0, c.errAt("rank", fmt.Errorf("auto: %w: %s; set rank: or pass the rank override",
			ErrAmbiguousRank, strings.Join(matches, ", ")))
	}
}
