package config

import (
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/rendezvous"
	"github.com/collectived/collectived/ring"
)

// Config is one node's view of a job: what the job is (name, token, local
// size), where every daemon of the ring listens, which of them this node is,
// and the knobs of its socket, timeouts, ring and limits.
//
// Every node of a job uses the same file (only rank, listen, socket and log
// may differ between nodes; ShapeDigest covers what must not).
type Config struct {
	Job Job
	// Peers are the ring's daemons in ring order, as host:port. A node's
	// rank is its index here; its next neighbour is Peers[(rank+1)%N].
	Peers []string
	// Rank is this node's index in Peers, or auto: the unique peer whose
	// address is on a local interface (see ResolveRank).
	Rank RankSpec
	// Listen is the address the daemon binds for ring links. Empty means
	// Peers[rank]; "0.0.0.0:7070" binds every interface while the other
	// nodes still dial Peers[rank].
	Listen   string
	Socket   Socket
	Timeouts Timeouts
	Ring     Ring
	Fusion   Fusion
	Limits   Limits
	Log      Log

	// pos remembers where each key was read from, so that errors found
	// after parsing (Validate, ResolveRank, Token) still name the line.
	pos *origin
}

// Job identifies the training run. The token authenticates nodes to each
// other and never crosses the wire; exactly one of TokenFile and TokenEnv is
// set.
type Job struct {
	Name      string
	TokenFile string // absolute path of a file only its owner may read
	TokenEnv  string // name of an environment variable holding the token
	LocalSize int    // trainers per node, the same on every node
}

// Socket is the Unix socket local trainers attach to.
type Socket struct {
	Path string
	Mode os.FileMode // permission bits only; written in YAML as octal "0660"
	// AllowedUIDs and AllowedGIDs list the peers (by SO_PEERCRED) that may
	// attach. Both empty means only the daemon's own uid and root.
	AllowedUIDs []uint32
	AllowedGIDs []uint32
}

// Timeouts bound every wait of the daemon. All are > 0: nothing waits
// forever.
type Timeouts struct {
	Connect          time.Duration // forming the ring: dialing and accepting both neighbours
	Collective       time.Duration // one collective, from the first local call to its result
	FirstCall        time.Duration // the first collective of a ring generation (model load, compilation)
	StallWarning     time.Duration // when a waiting collective is reported with the ranks it waits for
	Hello            time.Duration // one peer handshake once the TCP connection is up
	Heartbeat        time.Duration // interval of heartbeats on an idle link
	HeartbeatTimeout time.Duration // silence after which a link is declared dead
}

// Ring tunes the ring algorithm.
type Ring struct {
	Streams      int   // TCP streams per link
	SegmentBytes int64 // pipeline segment: receive, reduce and send overlap at this grain
	SmallBytes   int64 // buffers up to this size (inclusive) circulate whole once (0: only those with fewer elements than ranks)
	// Spin is how long the daemon polls a quiet socket (ring links and
	// trainers' connections) before it sleeps: it saves small collectives
	// a CPU wake-up per hop, which costs tens of microseconds on virtual
	// machines. 0 never polls.
	Spin time.Duration
}

// Fusion tunes how named calls ready together share ring operations
// (docs/MATCHING.md, "Named calls").
type Fusion struct {
	ThresholdBytes int64         // ready named allreduces packed into one ring operation, at most
	Cycle          time.Duration // how long a ready name waits for company before it is offered
}

// Limits bound what one client may make the daemon hold.
type Limits struct {
	InlineBytes   int64 // largest buffer carried inside a request frame
	ShmQuotaBytes int64 // shared memory per client
	MaxSegments   int   // shared-memory segments per client
	MaxInFlight   int   // calls in flight per client
	MaxClients    int   // attached clients
}

// Log selects the daemon's slog handler.
type Log struct {
	Level  string // debug, info, warn, error
	Format string // text, json
}

// RankSpec is the rank key: a fixed index, or Auto.
type RankSpec struct {
	Auto  bool
	Index int // meaningful only when !Auto
}

// AutoRank is the rank key's "auto".
func AutoRank() RankSpec { return RankSpec{Auto: true} }

// FixedRank is the rank key's integer form.
func FixedRank(i int) RankSpec { return RankSpec{Index: i} }

func (r RankSpec) String() string {
	if r.Auto {
		return "auto"
	}
	return strconv.Itoa(r.Index)
}

// Sizes.
const (
	KiB int64 = 1 << 10
	MiB int64 = 1 << 20
	GiB int64 = 1 << 30
	TiB int64 = 1 << 40
)

// Defaults. Timeouts follow the lessons in REFERENCES.md: a short first-call
// timeout kills slow first steps (horovod#1374), a long per-call one hides
// hangs (pytorch#118369), so the two are separate and stalls are reported
// long before either fires.
const (
	DefaultSocketPath = "/run/collectived/collectived.sock"
	DefaultSocketMode = os.FileMode(0o660)

	DefaultConnect          = 60 * time.Second
	DefaultCollective       = 300 * time.Second
	DefaultFirstCall        = 10 * time.Minute
	DefaultStallWarning     = 10 * time.Second
	DefaultHello            = 5 * time.Second
	DefaultHeartbeat        = 1 * time.Second
	DefaultHeartbeatTimeout = 10 * time.Second

	// Two streams of 512 KiB segments measured best on loopback; the
	// packages that use them declare them, with the figures.
	DefaultStreams            = rendezvous.DefaultStreams
	DefaultSegmentBytes int64 = ring.DefaultSegmentBytes
	// Buffers up to 64 KiB circulate whole: their frames are the largest
	// the op writes itself (ring/direct.go). On 2 nodes 4-64 KiB calls
	// took half the time or less than on the ring (docs/TUNING.md,
	// sections 16 and 17).
	DefaultSmallBytes = 64 * KiB
	DefaultSpin       = 200 * time.Microsecond

	DefaultInlineBytes         = 64 * KiB
	DefaultShmQuotaBytes int64 = ipc.DefaultShmQuota
	DefaultMaxSegments         = 1024
	DefaultMaxInFlight         = ipc.DefaultMaxInFlight
	// Horovod's defaults: 64 MiB fusion buffers, cycles of a millisecond
	// or a few.
	DefaultFusionThreshold = 64 * MiB
	DefaultFusionCycle     = time.Millisecond
	DefaultMaxClients      = 256

	DefaultLogLevel  = "info"
	DefaultLogFormat = "text"
)

// Bounds checked by Validate.
const (
	MaxLocalSize    = 1024
	MaxPeers        = 4096
	MaxJobNameLen   = 64
	MaxStreams      = 16
	MinSegmentBytes = 4 * KiB
	MaxSegmentBytes = 64 * MiB
	// MaxSmallBytes: whole-buffer frames beyond what the ring's op writes
	// itself (64 KiB, the ring's own bound) measured several times slower
	// (docs/TUNING.md, section 17), so a larger setting is refused here,
	// with the reason, rather than by the ring when the daemon starts.
	MaxSmallBytes  = 64 * KiB
	MaxSpin        = 10 * time.Millisecond
	MaxInlineBytes = 1 * MiB
	MaxInFlightCap = 65536
	MaxFusionBytes = 1 * GiB
	MaxFusionCycle = time.Second
	MaxSegmentsCap = 65536
	MaxClientsCap  = 65536
	MaxTimeout     = 24 * time.Hour
	// MaxSocketPath is what fits in sockaddr_un.sun_path with its NUL.
	MaxSocketPath = 107
	// MinTokenBytes is the shortest token accepted: HMAC keys shorter than
	// this are guessable.
	MinTokenBytes = 16
	// MaxTokenBytes bounds how much of a token file is read.
	MaxTokenBytes = 64 * 1024
)

// Default returns a config with every default set. Job.Name, the token
// source and Peers have no default; Rank defaults to auto.
func Default() Config {
	return Config{
		Job:  Job{LocalSize: 1},
		Rank: AutoRank(),
		Socket: Socket{
			Path: DefaultSocketPath,
			Mode: DefaultSocketMode,
		},
		Timeouts: Timeouts{
			Connect:          DefaultConnect,
			Collective:       DefaultCollective,
			FirstCall:        DefaultFirstCall,
			StallWarning:     DefaultStallWarning,
			Hello:            DefaultHello,
			Heartbeat:        DefaultHeartbeat,
			HeartbeatTimeout: DefaultHeartbeatTimeout,
		},
		Ring: Ring{
			Streams:      DefaultStreams,
			SegmentBytes: DefaultSegmentBytes,
			SmallBytes:   DefaultSmallBytes,
			Spin:         DefaultSpin,
		},
		Fusion: Fusion{ThresholdBytes: DefaultFusionThreshold, Cycle: DefaultFusionCycle},
		Limits: Limits{
			InlineBytes:   DefaultInlineBytes,
			ShmQuotaBytes: DefaultShmQuotaBytes,
			MaxSegments:   DefaultMaxSegments,
			MaxInFlight:   DefaultMaxInFlight,
			MaxClients:    DefaultMaxClients,
		},
		Log: Log{Level: DefaultLogLevel, Format: DefaultLogFormat},
	}
}

// WorldSize is the number of trainers in the job: peers times local size.
func (c *Config) WorldSize() int { return len(c.Peers) * c.Job.LocalSize }

// ListenAddress is the address to bind for ring links at rank: Listen if
// set, else the node's own peer address.
func (c *Config) ListenAddress(rank int) string {
	if c.Listen != "" {
		return c.Listen
	}
	if rank < 0 || rank >= len(c.Peers) {
		return ""
	}
	return c.Peers[rank]
}

// SetByFlag records that key (such as "socket.path") was set by the
// command-line flag (such as "--socket") after parsing. Errors about key
// then name the flag instead of the file's line, which no longer holds the
// value that was checked.
func (c *Config) SetByFlag(key, flag string) {
	if c.pos == nil {
		c.pos = &origin{}
	}
	if c.pos.flags == nil {
		c.pos.flags = map[string]string{}
	}
	c.pos.flags[key] = flag
}

// Source is the name the config was parsed from ("" if built in code).
func (c *Config) Source() string {
	if c.pos == nil {
		return ""
	}
	return c.pos.source
}

// SlogLevel maps Level to a slog level; an unknown level (rejected by
// Validate) maps to info.
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}
