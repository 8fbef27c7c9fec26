package localworld

import (
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
)

func TestParseRange(t *testing.T) {
	for _, tc := range []struct {
		in     string
		lo, hi int
		ok     bool
	}{
		{"32768\t60999\n", 32768, 60999, true},
		{"1024 65535", 1024, 65535, true},
		{"60999 32768", 0, 0, false},
		{"32768", 0, 0, false},
		{"0 100", 0, 0, false},
		{"a b", 0, 0, false},
	} {
		lo, hi, err := parseRange(tc.in)
		if (err == nil) != tc.ok || lo != tc.lo || hi != tc.hi {
			t.Errorf("parseRange(%q) = %d, %d, %v; want %d, %d, ok %v", tc.in, lo, hi, err, tc.lo, tc.hi, tc.ok)
		}
	}
}

func TestCandidates(t *testing.T) {
	for _, tc := range []struct {
		lo, hi int
		want   []span
	}{
		{32768, 60999, []span{{MinPort, 32767}, {61000, 65535}}},
		{32768, 65535, []span{{MinPort, 32767}}},
		{10000, 40000, []span{{40001, 65535}}},
		{1024, 65535, nil},
		{MinPort + 1, 65534, []span{{MinPort, MinPort}, {65535, 65535}}},
	} {
		if got := candidates(tc.lo, tc.hi); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("candidates(%d, %d) = %v, want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
}

// Ports for a world are different, bindable, and never in the kernel's
// ephemeral range, where dialers take their source ports.
func TestFreePortsOutsideEphemeralRange(t *testing.T) {
	lo, hi, err := EphemeralRange()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for range 20 {
		ports, err := FreePorts(3)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range ports {
			if p < MinPort || (p >= lo && p <= hi) {
				t.Fatalf("port %d is in the ephemeral range %d-%d or below %d", p, lo, hi, MinPort)
			}
			for _, q := range ports[:i] {
				if p == q {
					t.Fatalf("FreePorts(3) = %v: a port twice", ports)
				}
			}
			seen[p] = true
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				t.Fatalf("port %d from FreePorts does not bind: %v (environment: something took it just now)", p, err)
			}
			l.Close()
		}
	}
	// Drawn at random: 60 draws from thousands of ports all but never
	// repeat, while a counter or a fixed port would.
	if len(seen) < 50 {
		t.Errorf("60 ports drawn, only %d different: not random", len(seen))
	}
}

// A daemon that gave up on a port or socket held by someone else is the
// machine's doing, and the error says so; other failures get no such note.
func TestEnvHint(t *testing.T) {
	held := `collectived: rendezvous rank 0: listen on 127.0.0.1:23998: port still in use after 1s (7 attempts); held by LISTEN socket of pid 9 (python3)`
	if h := EnvHint(held); !strings.Contains(h, "comes from the machine, not the code") || !strings.Contains(h, "kill it by that pid") {
		t.Errorf("EnvHint(bind timeout) = %q", h)
	}
	if h := EnvHint("collectived: config.yaml:3: unknown key bogus"); h != "" {
		t.Errorf("EnvHint(config error) = %q, want none", h)
	}
}
