package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/rendezvous"
	"github.com/collectived/collectived/ring"
)

// Config is everything the core needs, already resolved: cmd/collectived
// builds it from the YAML file and the flags.
type Config struct {
	Job       string
	Token     []byte
	Peers     []string // node rank = index
	Rank      int
	Listen    string // "" = Peers[Rank]
	LocalSize int
	Digest    [32]byte // shape digest checked in the ring handshake

	SocketPath  string
	SocketMode  os.FileMode
	AllowedUIDs []uint32
	AllowedGIDs []uint32

	Streams      int
	SegmentBytes int
	SmallBytes   int
	// Spin is how long the daemon polls a quiet socket (ring links and
	// trainers' connections) before it sleeps; 0 never polls.
	Spin time.Duration

	ConnectTimeout    time.Duration // forming the ring
	CollectiveTimeout time.Duration // from a collective's first local call to its end
	FirstCallTimeout  time.Duration // the same, for the first collective of a generation
	StallWarning      time.Duration // log who has not called after this long
	HelloTimeout      time.Duration
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration
	ShutdownTimeout   time.Duration // how long Close waits for the engine

	// FusionThreshold bounds the bytes of ready named allreduces packed
	// into one ring operation; FusionCycle, how long a name ready on this
	// node waits for company before the node offers it (negotiate.go).
	FusionThreshold int
	FusionCycle     time.Duration

	InlineBytes int
	ShmQuota    int64
	MaxSegments int
	MaxInFlight int
	MaxClients  int

	Logger *slog.Logger
	// OnState, if set, is called with a one-line summary whenever the ring
	// state changes (systemd STATUS=). It must not block.
	OnState func(string)
}

// DefaultConfig returns a one-node world with the documented defaults
// (config.yaml's; TestDefaultConfigMatchesFile keeps them equal), except
// Spin: in-process daemons (tests, benchmarks of the core) never poll
// unless asked. Callers fill in the job, token, peers and socket.
func DefaultConfig() Config {
	return Config{
		LocalSize:         1,
		SocketMode:        0o660,
		Streams:           rendezvous.DefaultStreams,
		SegmentBytes:      ring.DefaultSegmentBytes,
		SmallBytes:        64 << 10,
		ConnectTimeout:    60 * time.Second,
		CollectiveTimeout: 300 * time.Second,
		FirstCallTimeout:  10 * time.Minute,
		StallWarning:      10 * time.Second,
		HelloTimeout:      5 * time.Second,
		HeartbeatInterval: time.Second,
		HeartbeatTimeout:  10 * time.Second,
		ShutdownTimeout:   10 * time.Second,
		FusionThreshold:   64 << 20,
		FusionCycle:       time.Millisecond,
		InlineBytes:       64 << 10,
		ShmQuota:          ipc.DefaultShmQuota,
		MaxSegments:       1024,
		MaxInFlight:       ipc.DefaultMaxInFlight,
		MaxClients:        256,
	}
}

// Verify reports the first field that cannot work.
func (c *Config) Verify() error {
	switch {
	case c.Job == "":
		return errors.New("daemon config: job name is empty")
	case len(c.Peers) == 0:
		return errors.New("daemon config: no peers")
	case c.Rank < 0 || c.Rank >= len(c.Peers):
		return fmt.Errorf("daemon config: rank %d outside [0, %d)", c.Rank, len(c.Peers))
	case c.LocalSize < 1:
		return fmt.Errorf("daemon config: local size %d < 1", c.LocalSize)
	case c.SocketPath == "":
		return errors.New("daemon config: socket path is empty")
	case len(c.Peers) > 1 && len(c.Token) == 0:
		return errors.New("daemon config: a world of several nodes needs a job token")
	case c.FusionThreshold < 0:
		return fmt.Errorf("daemon config: fusion threshold %d bytes is negative", c.FusionThreshold)
	case c.FusionCycle < 0:
		return fmt.Errorf("daemon config: fusion cycle %v is negative", c.FusionCycle)
	}
	for name, d := range map[string]time.Duration{
		"connect timeout": c.ConnectTimeout, "collective timeout": c.CollectiveTimeout,
		"first-call timeout": c.FirstCallTimeout, "stall warning": c.StallWarning,
		"hello timeout": c.HelloTimeout, "heartbeat interval": c.HeartbeatInterval,
		"heartbeat timeout": c.HeartbeatTimeout, "shutdown timeout": c.ShutdownTimeout,
	} {
		if d <= 0 {
			return fmt.Errorf("daemon config: %s must be positive, got %v", name, d)
		}
	}
	return nil
}

func (c *Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.DiscardHandler)
}
