package rendezvous

import (
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"
)

// Limits on the values a Config may hold. They are also the bounds the
// decoder enforces on a peer's hello, so both ends agree on them.
const (
	MaxJobLen  = 255 // bytes of the job name (one length byte on the wire)
	MaxStreams = 64  // TCP streams per link
	MinToken   = 16  // bytes of job token; shorter secrets are guessable
)

// DefaultStreams is the TCP streams per link collectived uses unless
// configured otherwise (config.DefaultStreams refers to it): two streams
// of 512 KiB segments measured best on loopback (ring.DefaultSegmentBytes).
const DefaultStreams = 2

// Config says who this node is in the job and how patient to be. The same
// Peers, Job, Token, Streams and Digest must be given to every node.
type Config struct {
	Job     string   // job name
	Token   []byte   // job secret; never sent, never logged
	Peers   []string // ordered "host:port" list; node rank = index
	Rank    int      // this node's index in Peers
	Listen  string   // bind address; "" = Peers[Rank]; may be "0.0.0.0:port"
	Streams int      // TCP streams per link (>=1; default DefaultStreams)

	// Digest summarises the job's shape (peer list, local size, ring
	// settings). It is computed by the caller; nodes whose digests differ
	// refuse each other.
	Digest [32]byte

	// Generation is this node's generation proposal, used by Form when it
	// is called with generation 0.
	Generation uint32

	ConnectTimeout   time.Duration // whole formation deadline (default 60s)
	BindTimeout      time.Duration // how long Listen retries a port in use (default 60s)
	HandshakeTimeout time.Duration // per-connection handshake deadline (default 5s)
	// MaxPending is how many unauthenticated handshakes from the prev
	// peer's address may be in progress at once (default 64): a newer one
	// evicts the oldest, so holding them keeps nobody out. Other
	// addresses get MaxPending/8 (at least 1) more; beyond that they are
	// refused at once (ErrBusy).
	MaxPending int

	Logger *slog.Logger // nil: logs are discarded

	// OnReject, if set, is called (from the listener's goroutines) for
	// every connection the listener refuses, with the remote address and
	// an error wrapping one of the sentinel errors. It must not block.
	OnReject func(addr string, err error)
}

// DefaultConfig returns a Config with the timeouts and limits filled in;
// the caller sets the job's identity.
func DefaultConfig() Config {
	return Config{
		Streams:          DefaultStreams,
		ConnectTimeout:   60 * time.Second,
		BindTimeout:      60 * time.Second,
		HandshakeTimeout: 5 * time.Second,
		MaxPending:       64,
		Logger:           slog.Default(),
	}
}

// withDefaults fills zero durations and limits with the defaults, so a
// Config built by hand without DefaultConfig still has finite waits.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Streams == 0 {
		c.Streams = d.Streams
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = d.ConnectTimeout
	}
	if c.BindTimeout == 0 {
		c.BindTimeout = d.BindTimeout
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.MaxPending == 0 {
		c.MaxPending = d.MaxPending
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Verify reports the first thing wrong with c, naming the field.
func (c Config) Verify() error {
	c = c.withDefaults()
	if c.Job == "" {
		return fmt.Errorf("rendezvous config: job name is empty")
	}
	if len(c.Job) > MaxJobLen {
		return fmt.Errorf("rendezvous config: job name is %d bytes, at most %d allowed", len(c.Job), MaxJobLen)
	}
	if len(c.Token) < MinToken {
		return fmt.Errorf("rendezvous config: job token is %d bytes, at least %d required", len(c.Token), MinToken)
	}
	if len(c.Peers) == 0 {
		return fmt.Errorf("rendezvous config: peer list is empty")
	}
	if c.Rank < 0 || c.Rank >= len(c.Peers) {
		return fmt.Errorf("rendezvous config: rank %d outside the peer list [0, %d)", c.Rank, len(c.Peers))
	}
	seen := make(map[string]int, len(c.Peers))
	for i, p := range c.Peers {
		if err := checkPeerAddr(p); err != nil {
			return fmt.Errorf("rendezvous config: peer %d %q: %w", i, p, err)
		}
		if j, ok := seen[p]; ok {
			return fmt.Errorf("rendezvous config: peer %d and peer %d are both %q", j, i, p)
		}
		seen[p] = i
	}
	if err := checkLoopbackMix(c.Peers); err != nil {
		return fmt.Errorf("rendezvous config: %w", err)
	}
	if c.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			return fmt.Errorf("rendezvous config: listen address %q: %w", c.Listen, err)
		}
	}
	if c.Streams < 1 || c.Streams > MaxStreams {
		return fmt.Errorf("rendezvous config: streams %d outside [1, %d]", c.Streams, MaxStreams)
	}
	if c.ConnectTimeout < 0 {
		return fmt.Errorf("rendezvous config: connect timeout %v is negative", c.ConnectTimeout)
	}
	if c.BindTimeout < 0 {
		return fmt.Errorf("rendezvous config: bind timeout %v is negative", c.BindTimeout)
	}
	if c.HandshakeTimeout < 0 {
		return fmt.Errorf("rendezvous config: handshake timeout %v is negative", c.HandshakeTimeout)
	}
	if c.MaxPending < 1 {
		return fmt.Errorf("rendezvous config: max pending handshakes %d, need at least 1", c.MaxPending)
	}
	return nil
}

func checkPeerAddr(p string) error {
	host, port, err := net.SplitHostPort(p)
	if err != nil {
		return err
	}
	if host == "" {
		return fmt.Errorf("no host")
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("unspecified address %s cannot be dialled by other nodes", host)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return fmt.Errorf("port %q is not in [1, 65535]", port)
	}
	return nil
}

// checkLoopbackMix refuses a peer list naming loopback for some peers and
// real addresses for others: a loopback address means a different host on
// each node, so such a list cannot describe one ring.
func checkLoopbackMix(peers []string) error {
	loop, other := -1, -1
	for i, p := range peers {
		host, _, _ := net.SplitHostPort(p)
		switch ip := net.ParseIP(host); {
		case strings.EqualFold(host, "localhost") || (ip != nil && ip.IsLoopback()):
			loop = i
		case ip != nil:
			other = i
		}
	}
	if loop >= 0 && other >= 0 {
		return fmt.Errorf("peer %d %q is a loopback address but peer %d %q is not: every node would dial itself for peer %d",
			loop, peers[loop], other, peers[other], loop)
	}
	return nil
}

// LogValue keeps the token out of logs when a Config is logged whole.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("job", c.Job),
		slog.Int("rank", c.Rank),
		slog.Any("peers", c.Peers),
		slog.String("listen", c.Listen),
		slog.Int("streams", c.Streams),
		slog.String("digest", shortHex(c.Digest)),
		slog.Duration("connect_timeout", c.ConnectTimeout),
		slog.Duration("bind_timeout", c.BindTimeout),
		slog.Duration("handshake_timeout", c.HandshakeTimeout),
		slog.Int("max_pending", c.MaxPending),
	)
}

// shortHex is the digest prefix shown in logs and errors: enough to tell
// two configurations apart at a glance.
func shortHex(d [32]byte) string { return hex.EncodeToString(d[:6]) }

func (c Config) next() int { return (c.Rank + 1) % len(c.Peers) }
func (c Config) prev() int { return (c.Rank - 1 + len(c.Peers)) % len(c.Peers) }
