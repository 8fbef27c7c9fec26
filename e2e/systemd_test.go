package e2e

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSystemdUnit: the unit denies every IP address and mounts nothing of
// its own; with the drop-in `collectived ipallow` makes from a config (the
// peers' addresses) installed beside it, it passes `systemd-analyze
// verify` and rates at an exposure of at most 2.0 with `systemd-analyze
// security --offline`, which sees the allow-list.
func TestSystemdUnit(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		// CI must run this check (issue 6), and scripts/setup.sh installs
		// it there: a skip would turn a missing install step green.
		if os.Getenv("CI") != "" {
			t.Fatal("systemd-analyze not installed in CI (Debian package systemd; scripts/setup.sh should have installed it)")
		}
		t.Skip("systemd-analyze not installed (Debian package systemd; scripts/setup.sh installs it)")
	}
	unit, err := os.ReadFile("../systemd/collectived.service")
	if err != nil {
		t.Fatal(err)
	}
	// IPAddressAllow= alone (without a deny) restricts nothing: the unit
	// denies all, and the drop-in allows the peers.
	lines := map[string]bool{}
	for _, l := range strings.Split(string(unit), "\n") {
		lines[strings.TrimSpace(l)] = true
	}
	for _, want := range []string{"IPAddressDeny=any", "PrivateMounts=yes", "Environment=COLLECTIVED_ALLOWED_PEERS=none"} {
		if !lines[want] {
			t.Errorf("the unit lacks %s", want)
		}
	}
	if lines["IPAddressAllow=any"] {
		t.Error("the unit allows any IP address")
	}
	// Verify the unit as installed: its ExecStart must name an executable.
	dir := t.TempDir()
	path := filepath.Join(dir, "collectived.service")
	text := strings.ReplaceAll(string(unit), "/usr/local/bin/collectived", daemonBin)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	// The peers' drop-in, made from a config as the README says.
	cfg := filepath.Join(dir, "config.yaml")
	os.WriteFile(cfg, []byte("job:\n  name: e2e\n  token_file: /nonexistent\npeers:\n  - 10.77.0.1:7101\n  - \"[fd00:77::2]:7101\"\n"), 0o600)
	dropIn, err := exec.Command(daemonBin, "ipallow", "--config", cfg).Output()
	if err != nil {
		t.Fatalf("collectived ipallow: %v", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "collectived.service.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "collectived.service.d", "peers.conf"), dropIn, 0o644); err != nil {
		t.Fatal(err)
	}
	verify := exec.Command(sa, "verify", "collectived.service")
	// Search the test's folder for the unit and its drop-ins first.
	verify.Env = append(os.Environ(), "SYSTEMD_UNIT_PATH="+dir+":")
	out, err := verify.CombinedOutput()
	// verify prints warnings about the host's own units on some machines;
	// only lines about our unit count.
	var ours []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "collectived.service") {
			ours = append(ours, l)
		}
	}
	if len(ours) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, strings.Join(ours, "\n"))
	}
	out, _ = exec.Command(sa, "security", "--offline=yes", path).CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for collectived.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security printed no exposure level:\n%s", out)
	}
	if !bytes.Contains(out, []byte("IP address allow list with non-localhost entries")) {
		t.Errorf("systemd-analyze security does not see the peers' allow-list:\n%s", out)
	}
	level, _ := strconv.ParseFloat(string(m[1]), 64)
	t.Logf("exposure level %.1f", level)
	if level > 2.0 {
		t.Fatalf("exposure level %.1f, want <= 2.0:\n%s", level, out)
	}
}

// TestSystemdNotify: under a NOTIFY_SOCKET the daemon says READY=1 once its
// sockets are bound, STATUS= with the ring's state and then its progress
// (trainers attached, calls made), WATCHDOG=1 at half of WATCHDOG_USEC,
// and STOPPING=1 on SIGTERM.
func TestSystemdNotify(t *testing.T) {
	dir, nsPath, ns := fakeNotifySocket(t)
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte("job:\n  name: e2e\n  token_env: E2E_TOKEN\npeers:\n  - 127.0.0.1:1\n"), 0o600)
	sock := filepath.Join(dir, "d.sock")
	cmd := exec.Command(daemonBin, "run", "--config", cfg, "--rank", "0", "--socket", sock)
	cmd.Env = append(os.Environ(), "E2E_TOKEN=0123456789abcdef0123", "NOTIFY_SOCKET="+nsPath, "WATCHDOG_USEC=200000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var log strings.Builder
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()

	seen := map[string]string{}
	buf := make([]byte, 4096)
	deadline := time.Now().Add(15 * time.Second)
	stopped, ringUp, progress := false, false, false
	for {
		ns.SetReadDeadline(deadline)
		n, _, err := ns.ReadFromUnix(buf)
		if err != nil {
			t.Fatalf("notify socket: %v; seen %v; log:\n%s", err, seen, log.String())
		}
		for _, line := range strings.Split(string(buf[:n]), "\n") {
			k, v, _ := strings.Cut(line, "=")
			if k == "" {
				continue
			}
			if k == "READY" {
				if _, err := os.Stat(sock); err != nil {
					t.Fatalf("READY=1 before the socket %s exists", sock)
				}
			}
			seen[k] = v
			if k == "STATUS" {
				ringUp = ringUp || strings.HasPrefix(v, "ring up")
				// The watchdog's tick (100 ms here) refreshes STATUS= with
				// the daemon's progress between state changes.
				progress = progress || strings.Contains(v, "trainers 0/1 attached, 0 calls")
			}
		}
		if !stopped && seen["READY"] == "1" && seen["WATCHDOG"] == "1" && ringUp && progress {
			stopped = true
			cmd.Process.Signal(syscall.SIGTERM)
		}
		if seen["STOPPING"] == "1" {
			break
		}
	}
	if !strings.Contains(seen["STATUS"], "generation") {
		t.Errorf("STATUS = %q, want the ring's state and generation", seen["STATUS"])
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon exit after SIGTERM: %v\n%s", err, log.String())
	}
}

// TestSystemdNoReadyWhenStartFails: READY=1 means the config is valid and
// the sockets are bound, so a daemon whose config is invalid, or whose
// ring port is taken, exits non-zero without ever saying READY (systemd
// then fails the start instead of reporting a service that is not there).
func TestSystemdNoReadyWhenStartFails(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		name, config, want string
	}{
		{"invalid config", "job:\n  name: e2e\n  token_env: E2E_TOKEN\n  bogus: 1\npeers:\n  - 127.0.0.1:1\n", "bogus"},
		// The daemon retries a port in use for timeouts.connect: 1s here.
		{"ring port taken", "job:\n  name: e2e\n  token_env: E2E_TOKEN\npeers:\n  - " + taken.Addr().String() + "\n  - 127.0.0.1:1\ntimeouts:\n  connect: 1s\n", taken.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, nsPath, ns := fakeNotifySocket(t)
			cfg := filepath.Join(dir, "c.yaml")
			if err := os.WriteFile(cfg, []byte(tc.config), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(daemonBin, "run", "--config", cfg, "--rank", "0", "--socket", filepath.Join(dir, "d.sock"))
			cmd.Env = append(os.Environ(), "E2E_TOKEN=0123456789abcdef0123", "NOTIFY_SOCKET="+nsPath)
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			var log strings.Builder
			cmd.Stderr = &log
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err = <-done:
			case <-time.After(15 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("daemon still running 15s after a failed start; log:\n%s", log.String())
			}
			if err == nil {
				t.Fatalf("daemon exited 0; log:\n%s", log.String())
			}
			if !strings.Contains(log.String(), tc.want) {
				t.Errorf("exit %v; log does not name %q:\n%s", err, tc.want, log.String())
			}
			// Everything the daemon sent is queued on the socket by now.
			buf := make([]byte, 4096)
			for {
				ns.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				n, _, err := ns.ReadFromUnix(buf)
				if err != nil {
					break
				}
				if strings.Contains("\n"+string(buf[:n]), "\nREADY=1") {
					t.Fatalf("daemon said READY=1 and then failed: %v; log:\n%s", err, log.String())
				}
			}
		})
	}
}

// fakeNotifySocket is systemd's side of sd_notify for a test: a datagram
// socket in a fresh short directory (sun_path is short), removed at the
// end of the test, and that directory for the daemon's other files.
func fakeNotifySocket(t *testing.T) (dir, path string, ns *net.UnixConn) {
	t.Helper()
	dir, err := os.MkdirTemp("", "cvd-notify-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path = filepath.Join(dir, "notify")
	ns, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return dir, path, ns
}
