// The configurations of the daemon's parts, derived from its Config.

package daemon

import (
	"log/slog"
	"time"

	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/rendezvous"
	"github.com/collectived/collectived/ring"
)

// RendezvousConfig is the ring listener's configuration for this node.
func (c Config) RendezvousConfig(log *slog.Logger) rendezvous.Config {
	rc := rendezvous.DefaultConfig()
	rc.Job = c.Job
	rc.Token = c.Token
	rc.Peers = c.Peers
	rc.Rank = c.Rank
	rc.Listen = c.Listen
	rc.Streams = c.Streams
	rc.Digest = c.Digest
	rc.ConnectTimeout = c.ConnectTimeout
	// A ring port in use at start is retried as long as a peer that is
	// slow to come up would be: both are a node not ready yet.
	rc.BindTimeout = c.ConnectTimeout
	rc.HandshakeTimeout = c.HelloTimeout
	rc.Logger = log
	return rc
}

// ServerConfig is the trainers' socket's configuration for this node.
func (c Config) ServerConfig(log *slog.Logger) ipc.ServerConfig {
	sc := ipc.DefaultServerConfig()
	sc.Path = c.SocketPath
	sc.Mode = c.SocketMode
	sc.BindTimeout = c.ConnectTimeout // as the ring port's (RendezvousConfig)
	sc.AllowedUIDs = c.AllowedUIDs
	sc.AllowedGIDs = c.AllowedGIDs
	sc.HelloTimeout = c.HelloTimeout
	sc.InlineLimit = c.InlineBytes
	sc.MaxInFlight = c.MaxInFlight
	sc.ShmQuota = c.ShmQuota
	sc.MaxSegments = c.MaxSegments
	sc.MaxClients = c.MaxClients
	sc.Spin = c.Spin
	if c.LocalSize > 1 {
		// A call waits for the node's other trainers as well as for the
		// ring, and its reader parks through the wait: have it poll
		// again after every answer (docs/TUNING.md, section 15).
		sc.RearmMinBytes = 0
	}
	sc.Logger = log
	return sc
}

// RingConfig is the ring engine's configuration for this node, proposing
// generation gen. `collectived bench --ring-only` runs the engine with it
// too, so that the sidecar's cost is measured against the same ring.
func (c Config) RingConfig(gen uint32, log *slog.Logger) ring.Config {
	rc := ring.DefaultConfig()
	rc.Rank, rc.Size = c.Rank, len(c.Peers)
	rc.Local = c.LocalSize
	rc.Generation = gen
	rc.SegmentBytes = c.SegmentBytes
	rc.SmallBytes = c.SmallBytes
	// The ring's no-progress timeout is longer than the local collective
	// timeouts, so that the node whose trainers are late reports the
	// precise cause (who has not called) before its neighbours time out.
	rc.OpTimeout = max(c.CollectiveTimeout, c.FirstCallTimeout)*5/4 + time.Second
	rc.HeartbeatInterval = c.HeartbeatInterval
	rc.HeartbeatTimeout = c.HeartbeatTimeout
	rc.Spin = c.Spin
	// Derived from settings the shape digest covers, so that every node
	// stripes the same ops: ranks that disagreed would wait on different
	// streams.
	rc.StripeBytes = ring.StripeSegments * c.SegmentBytes
	rc.Logger = log
	return rc
}
