package daemon

import (
	"log/slog"
	"time"

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
	rc.HandshakeTimeout = c.HelloTimeout
	rc.Logger = log
	return rc
}

// RingConfig is the ring engine's configuration for this node, proposing
// generation gen. `collectived bench --ring-only` runs the engine with it
// too, so that the sidecar's cost is measured against the same ring.
func (c Config) RingConfig(gen uint32, log *slog.Logger) ring.Config {
	rc := ring.DefaultConfig()
	rc.Rank, rc.Size = c.Rank, len(c.Peers)
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
