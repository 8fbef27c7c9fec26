package main

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/collectived/collectived/internal/logthrottle"
)

func fakeLookup(host string) ([]netip.Addr, error) {
	if host == "node3.example" {
		return []netip.Addr{netip.MustParseAddr("10.0.0.13"), netip.MustParseAddr("fd00::13")}, nil
	}
	return nil, errors.New("no such host")
}

func fakeServers() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.53")}, nil }

// The drop-in allows each peer's address once (IPv4-mapped and zoned
// forms plain), a host name's addresses as resolved now and then the name
// servers, and names the peer list it was made from.
func TestIPAllowDropIn(t *testing.T) {
	peers := []string{"10.0.0.1:7000", "10.0.0.1:7001", "[::ffff:10.0.0.2]:7000", "[fe80::2%eth0]:7000", "node3.example:7000"}
	out, err := ipAllowDropIn("/etc/collectived/config.yaml", peers, fakeLookup, fakeServers)
	if err != nil {
		t.Fatal(err)
	}
	var allows []string
	for _, l := range strings.Split(out, "\n") {
		if a, ok := strings.CutPrefix(l, "IPAddressAllow="); ok {
			allows = append(allows, a)
		}
	}
	want := []string{"10.0.0.1", "10.0.0.2", "fe80::2", "10.0.0.13", "fd00::13", "127.0.0.53"}
	if strings.Join(allows, " ") != strings.Join(want, " ") {
		t.Fatalf("allowed %v, want %v:\n%s", allows, want, out)
	}
	if !strings.Contains(out, "[Service]\n") || !strings.Contains(out, "Environment=COLLECTIVED_ALLOWED_PEERS="+peersDigest(peers)+"\n") ||
		!strings.Contains(out, "# node3.example resolves to 10.0.0.13 fd00::13 now") {
		t.Fatalf("drop-in:\n%s", out)
	}
	// Only IP addresses: no name servers.
	out, err = ipAllowDropIn("c.yaml", peers[:2], fakeLookup, func() ([]netip.Addr, error) { t.Fatal("name servers read"); return nil, nil })
	if err != nil || strings.Count(out, "IPAddressAllow=") != 1 {
		t.Fatalf("IP peers only: %v\n%s", err, out)
	}
	if _, err := ipAllowDropIn("c.yaml", []string{"10.0.0.1:7000", "gone.example:7000"}, fakeLookup, fakeServers); err == nil ||
		!strings.Contains(err.Error(), "cannot resolve gone.example") {
		t.Fatalf("an unresolvable peer: %v", err)
	}
}

// The daemon under the unit starts only with the allow-list made from its
// own peers; a world of one needs none.
func TestCheckAllowedPeers(t *testing.T) {
	peers := []string{"10.0.0.1:7000", "10.0.0.2:7000"}
	if err := checkAllowedPeers("c.yaml", peers, peersDigest(peers)); err != nil {
		t.Fatal(err)
	}
	if err := checkAllowedPeers("c.yaml", peers[:1], "none"); err != nil {
		t.Fatalf("a world of one: %v", err)
	}
	for env, want := range map[string]string{
		"none":                       "no allow-list of the peers is installed: make it from this config: collectived ipallow --config c.yaml > /etc/systemd/system/collectived.service.d/peers.conf",
		peersDigest([]string{"x:1"}): "made from another peer list than c.yaml's",
	} {
		if err := checkAllowedPeers("c.yaml", peers, env); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s=%s: %v, want %q", allowedPeersEnv, env, err, want)
		}
	}
}

// `collectived ipallow` reads the config (no token needed) and prints the
// drop-in; `collectived run` under a stale allow-list exits naming the fix.
func TestIPAllowCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte("job:\n  name: j\n  token_env: NO_SUCH_TOKEN_VAR\npeers:\n  - 192.0.2.1:7000\n  - 192.0.2.2:7000\n"), 0o600)
	app := newApp()
	app.ExitErrHandler = func(*cli.Context, error) {}
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	if err := app.Run([]string{"collectived", "ipallow", "--config", cfg}); err != nil {
		t.Fatalf("ipallow: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "IPAddressAllow=192.0.2.1\nIPAddressAllow=192.0.2.2\n") {
		t.Fatalf("ipallow printed:\n%s", out.String())
	}
	t.Setenv(allowedPeersEnv, "none")
	t.Setenv("NO_SUCH_TOKEN_VAR", "0123456789abcdef0123")
	err := app.Run([]string{"collectived", "run", "--config", cfg, "--rank", "0", "--socket", filepath.Join(dir, "s")})
	if err == nil || !strings.Contains(err.Error(), "collectived ipallow --config "+cfg) {
		t.Fatalf("run without the drop-in: %v", err)
	}
}

// `collectived status` prints the refusal counts: total, by reason, and
// the sources refused most.
func TestPrintRefused(t *testing.T) {
	var out bytes.Buffer
	printRefused(&out, "ring port", logthrottle.Counts{})
	if out.Len() != 0 {
		t.Fatalf("no refusals printed %q", out.String())
	}
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	printRefused(&out, "ring port", logthrottle.Counts{Total: 1234, Reasons: map[string]uint64{"bad magic": 1200, "other job": 34},
		Sources: []logthrottle.SourceCount{{Source: "10.0.0.9", Reason: "bad magic", Count: 1200, Last: at}}})
	want := "refused on the ring port: 1,234 (1,200 bad magic, 34 other job); most from 10.0.0.9 (1,200 bad magic, last 2026-01-02T03:04:05Z)\n"
	if out.String() != want {
		t.Fatalf("printed\n%q\nwant\n%q", out.String(), want)
	}
}
