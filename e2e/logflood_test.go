package e2e

import (
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
)

// The daemon's rate limit on repeated log lines (internal/logthrottle's
// defaults, docs/SECURITY.md): per kind of refusal and source, the first
// logBurst of a quiet spell are logged in full, the rest are counted and
// summarised once per logWindow.
const (
	logBurst  = 5
	logWindow = 10 * time.Second
	// logLineMax is a generous size for one refusal line or summary.
	logLineMax = 1024
)

// floodLogBound is the most a flood of `keys` kinds x sources may add to
// a daemon's log over elapsed: for each key, its burst, a summary per
// window begun and one more when it ends; and 8 KiB for lines about
// anything else.
func floodLogBound(keys int, elapsed time.Duration) int {
	windows := int(elapsed/logWindow) + 2
	return keys*(logBurst+windows)*logLineMax + 8<<10
}

// refusedStatus is the refusal counts of the STATUS_OK document
// (daemon.RefusedStatus).
type refusedStatus struct {
	Refused struct {
		Ring   refusedCounts `json:"ring"`
		Socket refusedCounts `json:"socket"`
	} `json:"refused"`
}

type refusedCounts struct {
	Total   uint64            `json:"total"`
	Reasons map[string]uint64 `json:"reasons"`
	Sources []struct {
		Source string `json:"source"`
		Reason string `json:"reason"`
		Count  uint64 `json:"count"`
	} `json:"sources"`
}

func (r refusedCounts) from(source, reason string) uint64 {
	for _, s := range r.Sources {
		if s.Source == source && s.Reason == reason {
			return s.Count
		}
	}
	return 0
}

// refusals asks the daemon at socket for its refusal counts: the ring
// port's and the Unix socket's.
func refusals(t *testing.T, socket string) (ring, sock refusedCounts) {
	t.Helper()
	var st refusedStatus
	statusInto(t, socket, &st)
	return st.Refused.Ring, st.Refused.Socket
}

// statusInto decodes the status document of the daemon at socket, asked
// as an observer, into v (the part of it a test reads).
func statusInto(t *testing.T, socket string, v any) {
	t.Helper()
	cl, err := cvd.Dial(cvd.Options{Socket: socket, Job: "e2e", Observer: true, LocalRank: -1,
		Label: "e2e status", Timeout: 5 * time.Second, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	raw, err := cl.StatusJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
}

// waitSummary waits (up to two windows) for a summary line in log naming
// source, reason and a count of at least min.
func waitSummary(t *testing.T, log func() string, source, reason string, min int) string {
	t.Helper()
	var found string
	waitFor(t, 2*logWindow+5*time.Second, "a summary of refusals from "+source+": "+reason, func() bool {
		for _, line := range strings.Split(log(), "\n") {
			if !strings.Contains(line, "refused from "+source+" in the last") || !strings.Contains(line, reason) {
				continue
			}
			i := strings.Index(line, "count=")
			if i < 0 {
				continue
			}
			n, _ := strconv.Atoi(strings.Fields(line[i+len("count="):])[0])
			if n >= min {
				found = line
				return true
			}
		}
		return false
	})
	return found
}

// TestLogFloodRingPort: 3,000 strangers' connections to a ring port, half
// sending garbage, half a hello of another job, grow the daemon's log by
// at most the rate limit's bound (a handful of lines per kind and source,
// not a line each), the log summarises them with their count, and
// `collectived status` counts every one by reason and source.
func TestLogFloodRingPort(t *testing.T) {
	c := newLoopCluster(t, 2, 1)
	c.startAll()
	hello := c.validHello(0)
	hello.job = "stranger"
	other := hello.frame()
	garbage := []byte("GET / HTTP/1.1\r\nHost: collectived\r\n\r\n")
	before := len(c.fullLog(1))
	start := time.Now()
	const n = 3000
	for i := range n {
		conn, err := net.DialTimeout("tcp", c.addrs[1], 5*time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if i%2 == 0 {
			conn.Write(garbage)
		} else {
			conn.Write(other)
		}
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, conn); err != nil && !isReset(err) {
			t.Fatalf("connection %d not closed by the daemon: %v", i, err)
		}
		conn.Close()
	}
	elapsed := time.Since(start)
	grown := len(c.fullLog(1)) - before
	bound := floodLogBound(2, elapsed)
	t.Logf("%d refused connections in %v added %d bytes of log (bound %d)", n, elapsed.Round(time.Millisecond), grown, bound)
	if grown > bound {
		t.Fatalf("%d refused connections in %v added %d bytes of log, over the rate limit's bound of %d; the last lines:\n%s",
			n, elapsed.Round(time.Millisecond), grown, bound, c.log(1))
	}
	r, _ := refusals(t, c.sockets[1])
	if r.Total < n || r.Reasons["not a collectived rendezvous handshake (bad magic)"] < n/2 || r.Reasons["other job"] < n/2 {
		t.Fatalf("status counts %+v, want %d refusals: %d bad magic, %d other job", r, n, n/2, n/2)
	}
	if got := r.from("127.0.0.1", "other job"); got < n/2 {
		t.Fatalf("status counts %d refusals from 127.0.0.1 for another job, want %d: %+v", got, n/2, r)
	}
	line := waitSummary(t, func() string { return c.fullLog(1) }, "127.0.0.1", "other job", n/2-logBurst)
	t.Logf("summary: %s", line)
}

// TestLogFloodSocket: 2,000 connections to the Unix socket from a uid the
// daemon does not allow grow its log by at most the rate limit's bound,
// are summarised with their count, and `collectived status` counts them.
func TestLogFloodSocket(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another uid")
	}
	w := startWorld(t, 1, 1, fastTimeouts+"socket:\n  mode: \"0666\"\n  allowed_uids: [0]\n")
	// The flood, run as nobody, must reach the socket file to be refused
	// by the daemon rather than by the file system.
	os.Chmod(w.dir, 0o755)
	os.Chmod(trainerBin, 0o755)
	os.Chmod(strings.TrimSuffix(trainerBin, "/trainer"), 0o755)
	logOf := func() string { b, _ := os.ReadFile(w.logs[0]); return string(b) }
	before := len(logOf())
	const n = 2000
	start := time.Now()
	cmd := exec.Command(trainerBin, "-socket", w.sockets[0], "-connect-flood", strconv.Itoa(n))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != strconv.Itoa(n) {
		t.Fatalf("flood as uid 65534: %v: %s", err, out)
	}
	elapsed := time.Since(start)
	grown := len(logOf()) - before
	bound := floodLogBound(1, elapsed)
	t.Logf("%d refused connections in %v added %d bytes of log (bound %d)", n, elapsed.Round(time.Millisecond), grown, bound)
	if grown > bound {
		tail := logOf()
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		t.Fatalf("%d refused connections in %v added %d bytes of log, over the rate limit's bound of %d; the last lines:\n%s",
			n, elapsed.Round(time.Millisecond), grown, bound, tail)
	}
	_, s := refusals(t, w.sockets[0])
	if s.Total < n || s.Reasons["PERMISSION"] < n || s.from("uid 65534", "PERMISSION") < n {
		t.Fatalf("status counts %+v, want %d PERMISSION refusals of uid 65534", s, n)
	}
	line := waitSummary(t, logOf, "uid 65534", "PERMISSION", n-logBurst)
	t.Logf("summary: %s", line)
}
