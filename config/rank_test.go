package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func localAddrs(t *testing.T) []netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out
}

// nonLocal returns n documentation addresses that are not on this
// machine's interfaces. They are only compared, never contacted.
func nonLocal(t *testing.T, n int) []string {
	t.Helper()
	local := localAddrs(t)
	var out []string
	for _, s := range []string{"192.0.2.1", "198.51.100.1", "203.0.113.1", "192.0.2.201", "198.51.100.201", "203.0.113.201"} {
		a := netip.MustParseAddr(s)
		isLocal := false
		for _, l := range local {
			isLocal = isLocal || l == a
		}
		if !isLocal {
			out = append(out, s)
		}
		if len(out) == n {
			return out
		}
	}
	t.Skipf("fewer than %d documentation addresses are non-local here", n)
	return nil
}

func rankConfig(peers ...string) *Config {
	c := Default()
	c.Job.Name, c.Job.TokenEnv = "demo", "T"
	c.Peers = peers
	return &c
}

func TestResolveRankOverride(t *testing.T) {
	c := mustParse(t, base+"rank: 1\n")
	for _, tc := range []struct {
		override, want int
	}{{-1, 1}, {0, 0}, {1, 1}} {
		if got, err := c.ResolveRank(tc.override); err != nil || got != tc.want {
			t.Errorf("ResolveRank(%d) = %d, %v; want %d", tc.override, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		override int
		want     string
	}{
		{2, "config.yaml: rank: override 2 is out of range: 2 peers give ranks 0 to 1"},
		{-2, "config.yaml: rank: override -2 is not a rank (-1 means none)"},
	} {
		if _, err := c.ResolveRank(tc.override); err == nil || err.Error() != tc.want {
			t.Errorf("ResolveRank(%d) error = %v; want %q", tc.override, err, tc.want)
		}
	}
	// The override also settles auto on an all-loopback list.
	auto := mustParse(t, base)
	if got, err := auto.ResolveRank(1); err != nil || got != 1 {
		t.Errorf("auto ResolveRank(1) = %d, %v", got, err)
	}
}

func TestResolveRankFixedOutOfRange(t *testing.T) {
	c := rankConfig("127.0.0.1:1")
	c.Rank = FixedRank(3)
	if _, err := c.ResolveRank(-1); err == nil || !strings.Contains(err.Error(), "rank: 3 is out of range") {
		t.Errorf("ResolveRank = %v", err)
	}
	if _, err := rankConfig().ResolveRank(-1); err == nil || !strings.Contains(err.Error(), "peers: no peers") {
		t.Errorf("ResolveRank without peers = %v", err)
	}
}

// The realistic case: one daemon per machine, routable addresses. This
// machine's own non-loopback address among documentation addresses that
// are not its own; the config validates and auto finds it.
func TestResolveRankAutoRoutable(t *testing.T) {
	var own netip.Addr
	for _, a := range localAddrs(t) {
		if !a.IsLoopback() && !a.IsLinkLocalUnicast() && a.Is4() {
			own = a
			break
		}
	}
	if !own.IsValid() {
		t.Skip("no non-loopback IPv4 address on this machine")
	}
	others := nonLocal(t, 2)
	src := fmt.Sprintf("job:\n  name: demo\n  token_env: T\npeers:\n  - %s:7000\n  - %s:7000\n  - %s:7000\n", others[0], own, others[1])
	c := mustParse(t, src)
	if got, err := c.ResolveRank(-1); err != nil || got != 1 {
		t.Errorf("ResolveRank = %d, %v; want 1 (%s is local)", got, err, own)
	}
}

// What the brief's loopback test looks like: exactly one loopback peer
// among non-local ones. Validate refuses that list (a mixed list means a
// misconfigured node), but ResolveRank works on what it is given.
func TestResolveRankAutoOneLoopback(t *testing.T) {
	others := nonLocal(t, 2)
	for _, tc := range []struct {
		want  int
		peers []string
	}{
		{0, []string{"127.0.0.1:1", others[0] + ":1", others[1] + ":1"}},
		{1, []string{others[0] + ":1", "127.0.0.1:1", others[1] + ":1"}},
		{2, []string{others[0] + ":1", others[1] + ":1", "localhost:1"}},
		{2, []string{others[0] + ":1", others[1] + ":1", "[::1]:1"}},
	} {
		want, peers := tc.want, tc.peers
		c := rankConfig(peers...)
		if got, err := c.ResolveRank(-1); err != nil || got != want {
			t.Errorf("peers %v: ResolveRank = %d, %v; want %d", peers, got, err, want)
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "peers: mixes loopback") {
			t.Errorf("peers %v: Validate = %v; want the loopback mix refused", peers, err)
		}
	}
}

func TestResolveRankAutoNoneLocal(t *testing.T) {
	others := nonLocal(t, 2)
	c := mustParse(t, fmt.Sprintf("job:\n  name: demo\n  token_env: T\npeers:\n  - %s:1\n  - %s:1\nrank: auto\n", others[0], others[1]))
	_, err := c.ResolveRank(-1)
	if !errors.Is(err, ErrNoLocalPeer) {
		t.Fatalf("ResolveRank = %v; want ErrNoLocalPeer", err)
	}
	if !strings.Contains(err.Error(), "config.yaml:7: rank: auto: no peer address is on a local interface (this machine has 127.0.0.1") {
		t.Errorf("error = %v", err)
	}
}

// Every daemon on one machine: all peers are local, so auto cannot pick.
func TestResolveRankAutoAllLoopbackIsAmbiguous(t *testing.T) {
	c := mustParse(t, base)
	_, err := c.ResolveRank(-1)
	if !errors.Is(err, ErrAmbiguousRank) {
		t.Fatalf("ResolveRank = %v; want ErrAmbiguousRank", err)
	}
	want := "config.yaml:1: rank: auto: more than one peer address is on a local interface: " +
		"peers[0] 127.0.0.1:7101 (127.0.0.1), peers[1] 127.0.0.1:7102 (127.0.0.1); set rank: or pass the rank override"
	if err.Error() != want {
		t.Errorf("error:\n%v\nwant:\n%s", err, want)
	}
}

// Host names go through the resolver; here a stand-in, so that the test
// never sends a DNS query.
func TestAutoRankNames(t *testing.T) {
	local := []netip.Addr{netip.MustParseAddr("10.1.2.3")}
	lookup := func(host string) ([]netip.Addr, error) {
		switch host {
		case "me":
			return []netip.Addr{netip.MustParseAddr("fd00::9"), netip.MustParseAddr("10.1.2.3")}, nil
		case "other":
			return []netip.Addr{netip.MustParseAddr("10.1.2.4")}, nil
		}
		return nil, fmt.Errorf("no such host %s", host)
	}
	c := rankConfig("other:1", "me:1")
	if got, err := c.autoRank(local, lookup); err != nil || got != 1 {
		t.Errorf("autoRank = %d, %v; want 1", got, err)
	}
	c = rankConfig("other:1", "ghost:1", "bad")
	_, err := c.autoRank(local, lookup)
	if !errors.Is(err, ErrNoLocalPeer) ||
		!strings.Contains(err.Error(), `(this machine has 10.1.2.3); peers[1] "ghost:1" does not resolve: no such host ghost; peers[2] "bad" is not host:port`) {
		t.Errorf("autoRank = %v", err)
	}
	c = rankConfig("me:1", "[::ffff:10.1.2.3]:2")
	if _, err := c.autoRank(local, lookup); !errors.Is(err, ErrAmbiguousRank) {
		t.Errorf("autoRank = %v; want ErrAmbiguousRank", err)
	}
}
