package config

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Validate checks every value and the rules between values, and returns an
// ErrorList of every problem (nil if none). Each error names the key and,
// for a parsed config, its line.
func (c *Config) Validate() error {
	return c.validate().err()
}

type checker struct {
	c    *Config
	errs ErrorList
}

func (v *checker) failf(key, format string, args ...any) {
	v.errs = append(v.errs, v.c.errAt(key, fmt.Errorf(format, args...)))
}

func (c *Config) validate() ErrorList {
	v := &checker{c: c}
	v.job()
	v.peers()
	v.rank()
	v.listen()
	v.socket()
	v.timeouts()
	v.ring()
	v.limits()
	v.fusion()
	v.log()
	return v.errs
}

func (v *checker) job() {
	j := &v.c.Job
	switch {
	case j.Name == "":
		v.failf("job.name", "is empty; every node of a job must give the same name")
	case len(j.Name) > MaxJobNameLen:
		v.failf("job.name", "is %d bytes long; at most %d", len(j.Name), MaxJobNameLen)
	case !isName(j.Name):
		v.failf("job.name", "%q may hold only letters, digits, '.', '_' and '-'", j.Name)
	}
	switch {
	case j.TokenFile != "" && j.TokenEnv != "":
		v.failf("job", "sets both token_file and token_env; keep one, so it is clear which token is used")
	case j.TokenFile == "" && j.TokenEnv == "":
		v.failf("job", "needs the job token: set token_file (a file only the daemon's user can read) or token_env (an environment variable)")
	case j.TokenFile != "" && !filepath.IsAbs(j.TokenFile) && !strings.HasPrefix(j.TokenFile, CredentialsPrefix):
		v.failf("job.token_file", "%q is not an absolute path", j.TokenFile)
	case j.TokenEnv != "" && !isEnvName(j.TokenEnv):
		v.failf("job.token_env", "%q is not an environment variable name", j.TokenEnv)
	}
	if j.LocalSize < 1 || j.LocalSize > MaxLocalSize {
		v.failf("job.local_size", "%d is out of range: 1 to %d trainers per node", j.LocalSize, MaxLocalSize)
	}
}

func isName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

func isEnvName(s string) bool {
	for i, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '_' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return s != ""
}

// hostPort splits a dialable host:port. The port is numeric: a service
// name would resolve differently on different nodes.
func hostPort(addr string, hostRequired bool) (host string, port int, err error) {
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%q is not host:port (write an IPv6 address as [::1]:7070)", addr)
	}
	if hostRequired && host == "" {
		return "", 0, fmt.Errorf("%q has no host", addr)
	}
	if _, err := netip.ParseAddr(host); err != nil && !isHostName(host) {
		return "", 0, fmt.Errorf("%q: host %q is neither an IP address nor a host name", addr, host)
	}
	port, err = strconv.Atoi(ps)
	if err != nil || ps[0] == '+' || ps[0] == '-' {
		return "", 0, fmt.Errorf("%q: port %q is not a number", addr, ps)
	}
	if port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: port %d is out of range 1-65535", addr, port)
	}
	return host, port, nil
}

// isHostName accepts DNS names (and the '_' some private names use); it
// keeps spaces, control characters and URL pieces out of addresses.
func isHostName(s string) bool {
	if len(s) > 253 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return false
		}
	}
	return true
}

// canonicalHost makes two spellings of one IP compare equal.
func canonicalHost(host string) string {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().String()
	}
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// isLoopbackHost is decided without resolving: an IP literal in 127/8 or
// ::1, or the name localhost (RFC 6761).
func isLoopbackHost(host string) bool {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().IsLoopback()
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}

func (v *checker) peers() {
	peers := v.c.Peers
	if len(peers) == 0 {
		v.failf("peers", "no peers: list every node's daemon as host:port, in ring order")
		return
	}
	if len(peers) > MaxPeers {
		v.failf("peers", "has %d entries; at most %d are supported", len(peers), MaxPeers)
		return
	}
	seen := make(map[string]int, len(peers))
	loop, remote := -1, -1
	for i, addr := range peers {
		key := fmt.Sprintf("peers[%d]", i)
		host, port, err := hostPort(addr, true)
		if err != nil {
			v.failf(key, "%v", err)
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil && (a.IsUnspecified() || a.IsMulticast()) {
			v.failf(key, "%q cannot be dialed; give the node's own address (use listen: to bind every interface)", addr)
			continue
		}
		id := net.JoinHostPort(canonicalHost(host), strconv.Itoa(port))
		if first, dup := seen[id]; dup {
			v.failf(key, "%q repeats peers[%d] (%q); each node appears once", addr, first, peers[first])
			continue
		}
		seen[id] = i
		if isLoopbackHost(host) {
			if loop < 0 {
				loop = i
			}
		} else if remote < 0 {
			remote = i
		}
	}
	if loop >= 0 && remote >= 0 {
		v.failf("peers", "mixes loopback (peers[%d] %q) and non-loopback (peers[%d] %q) addresses: "+
			"another node would dial its own loopback; give every node's routable address "+
			"(an all-loopback list is for running every daemon on one machine)",
			loop, peers[loop], remote, peers[remote])
	}
}

func (v *checker) rank() {
	r := v.c.Rank
	if r.Auto || v.c.pos.isBad("peers") || len(v.c.Peers) == 0 {
		return
	}
	if r.Index < 0 || r.Index >= len(v.c.Peers) {
		v.failf("rank", "%d is out of range: %d peers give ranks 0 to %d", r.Index, len(v.c.Peers), len(v.c.Peers)-1)
	}
}

func (v *checker) listen() {
	if v.c.Listen == "" {
		return
	}
	if _, _, err := hostPort(v.c.Listen, false); err != nil {
		v.failf("listen", "%v", err)
	}
}

func (v *checker) socket() {
	s := &v.c.Socket
	switch {
	case s.Path == "":
		v.failf("socket.path", "is empty")
	case !filepath.IsAbs(s.Path):
		v.failf("socket.path", "%q is not an absolute path", s.Path)
	case len(s.Path) > MaxSocketPath:
		v.failf("socket.path", "is %d bytes long; a Unix socket address holds at most %d", len(s.Path), MaxSocketPath)
	}
	switch {
	case s.Mode&^0o777 != 0:
		v.failf("socket.mode", "%#o has bits beyond 0777 (setuid, setgid, sticky or a file type); give permission bits only", uint32(s.Mode))
	case s.Mode&0o600 != 0o600:
		v.failf("socket.mode", "%04o lacks owner read and write (0600); the daemon's own user could not connect", uint32(s.Mode))
	}
	for i, id := range s.AllowedUIDs {
		if id == 1<<32-1 {
			v.failf(fmt.Sprintf("socket.allowed_uids[%d]", i), "4294967295 is not a user id")
		}
	}
	for i, id := range s.AllowedGIDs {
		if id == 1<<32-1 {
			v.failf(fmt.Sprintf("socket.allowed_gids[%d]", i), "4294967295 is not a group id")
		}
	}
}

func (v *checker) timeouts() {
	t := &v.c.Timeouts
	all := []struct {
		key string
		d   time.Duration
	}{
		{"timeouts.connect", t.Connect},
		{"timeouts.collective", t.Collective},
		{"timeouts.first_call", t.FirstCall},
		{"timeouts.stall_warning", t.StallWarning},
		{"timeouts.hello", t.Hello},
		{"timeouts.heartbeat", t.Heartbeat},
		{"timeouts.heartbeat_timeout", t.HeartbeatTimeout},
	}
	ok := true
	for _, f := range all {
		switch {
		case f.d <= 0:
			v.failf(f.key, "%v is not positive; every wait needs a finite timeout above zero", f.d)
			ok = false
		case f.d > MaxTimeout:
			v.failf(f.key, "%v is longer than %v; a wait that long cannot be told from a hang", f.d, MaxTimeout)
			ok = false
		}
	}
	if !ok {
		return
	}
	if t.HeartbeatTimeout <= t.Heartbeat {
		v.failf("timeouts.heartbeat_timeout", "%v is not longer than timeouts.heartbeat (%v); every idle link would be declared dead", t.HeartbeatTimeout, t.Heartbeat)
	}
	if t.StallWarning >= t.Collective {
		v.failf("timeouts.stall_warning", "%v is not shorter than timeouts.collective (%v); the stall would never be reported before the timeout", t.StallWarning, t.Collective)
	}
}

func (v *checker) ring() {
	r := &v.c.Ring
	if r.Streams < 1 || r.Streams > MaxStreams {
		v.failf("ring.streams", "%d is out of range: 1 to %d TCP streams per link", r.Streams, MaxStreams)
	}
	switch {
	case r.SegmentBytes < MinSegmentBytes || r.SegmentBytes > MaxSegmentBytes:
		v.failf("ring.segment_bytes", "%s is out of range: %s to %s", FormatSize(r.SegmentBytes), FormatSize(MinSegmentBytes), FormatSize(MaxSegmentBytes))
	case r.SegmentBytes%8 != 0:
		v.failf("ring.segment_bytes", "%d is not a multiple of 8; a segment must never split an element", r.SegmentBytes)
	}
	if r.SmallBytes < 0 || r.SmallBytes > MaxSmallBytes {
		v.failf("ring.small_bytes", "%s is out of range: 0 to %s (larger buffers circulating whole measured several times slower than the ring; docs/TUNING.md, section 17)", FormatSize(r.SmallBytes), FormatSize(MaxSmallBytes))
	}
	if r.Spin < 0 || r.Spin > MaxSpin {
		v.failf("ring.spin", "%v is out of range: 0 (never poll) to %v", r.Spin, MaxSpin)
	}
}

func (v *checker) fusion() {
	f := &v.c.Fusion
	if f.ThresholdBytes < 0 || f.ThresholdBytes > MaxFusionBytes {
		v.failf("fusion.threshold_bytes", "%s is out of range: 0 (no fusion) to %s", FormatSize(f.ThresholdBytes), FormatSize(MaxFusionBytes))
	}
	if f.Cycle < 0 || f.Cycle > MaxFusionCycle {
		v.failf("fusion.cycle", "%v is out of range: 0 to %v", f.Cycle, MaxFusionCycle)
	}
}

func (v *checker) limits() {
	l := &v.c.Limits
	if l.InlineBytes < 0 || l.InlineBytes > MaxInlineBytes {
		v.failf("limits.inline_bytes", "%s is out of range: 0 to %s (larger buffers go through shared memory)", FormatSize(l.InlineBytes), FormatSize(MaxInlineBytes))
	}
	if l.ShmQuotaBytes < 0 {
		v.failf("limits.shm_quota_bytes", "%d is negative", l.ShmQuotaBytes)
	}
	if l.MaxSegments < 1 || l.MaxSegments > MaxSegmentsCap {
		v.failf("limits.max_segments", "%d is out of range: 1 to %d segments per client", l.MaxSegments, MaxSegmentsCap)
	}
	if l.MaxInFlight < 1 || l.MaxInFlight > MaxInFlightCap {
		v.failf("limits.max_in_flight", "%d is out of range: 1 to %d calls per client", l.MaxInFlight, MaxInFlightCap)
	}
	switch {
	case l.MaxClients < 1 || l.MaxClients > MaxClientsCap:
		v.failf("limits.max_clients", "%d is out of range: 1 to %d", l.MaxClients, MaxClientsCap)
	case l.MaxClients < v.c.Job.LocalSize:
		v.failf("limits.max_clients", "%d is below job.local_size (%d); not every trainer of this node could attach", l.MaxClients, v.c.Job.LocalSize)
	}
}

func (v *checker) log() {
	switch v.c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		v.failf("log.level", "%q is not a level: debug, info, warn or error", v.c.Log.Level)
	}
	switch v.c.Log.Format {
	case "text", "json":
	default:
		v.failf("log.format", "%q is not a format: text or json", v.c.Log.Format)
	}
}
