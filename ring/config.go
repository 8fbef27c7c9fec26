package ring

import (
	"fmt"
	"log/slog"
	"time"
)

// Config tunes one Ring. Start from DefaultConfig and set Rank, Size and
// Generation; the remaining fields have working defaults. SegmentBytes
// and SmallBytes shape the frames and must be the same on every rank.
type Config struct {
	Rank, Size int
	// Local is the number of world ranks each ring rank serves (a
	// daemon's trainers): an avg divides by Size*Local, and the per-rank
	// counts and roots of the version-3 collectives are world ranks,
	// Local to a ring rank, in order. 0 means 1.
	Local int
	// Generation is this rank's proposal; Start adopts the maximum
	// proposal of all ranks.
	Generation uint32
	// Finished is how many collectives this rank's owner has finished
	// (completed or failed) in earlier generations; Start adopts the
	// maximum of all ranks' as Ring.Finished. An owner that failed a
	// collective its peers never learnt of is ahead by it, and they
	// learn so here (docs/MATCHING.md, the generation rule).
	Finished uint64
	// Fresh tells the other ranks that this rank's owner has just
	// started (it has formed no generation yet). Fresh ranks beside ones
	// that are not (Ring.Restarted) are daemons restarted into a running
	// job, which restarts the job's trainers.
	Fresh bool
	// Vacated tells the other ranks that this rank's owner saw its job's
	// trainers leave since it last finished a collective: the job is
	// restarting them (Ring.AnyVacated).
	Vacated bool
	// SegmentBytes is the pipeline segment: the largest data frame payload
	// and the size of each receive buffer. A multiple of 8.
	SegmentBytes int
	// SmallBytes is the largest allreduce whose every rank's whole buffer
	// circulates once instead of going round the reduce-scatter/allgather
	// ring (a buffer of exactly SmallBytes circulates whole).
	SmallBytes int
	// OpTimeout fails an op that makes no progress (no frame received, no
	// frame sent) for this long.
	OpTimeout time.Duration
	// HeartbeatInterval is how long a link may stay silent before a
	// heartbeat frame is sent on it.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long a peer may send nothing at all (while
	// we are ready to read) before it is declared hung.
	HeartbeatTimeout time.Duration
	// MaxGatherBytes bounds one rank's block in an allgather; a peer
	// announcing a larger block fails the ring with ErrBadFrame.
	MaxGatherBytes int
	// SocketBuffer, if > 0, sets SO_SNDBUF and SO_RCVBUF on TCP links.
	// 0 leaves the kernel's autotuning alone (best on loopback and LANs).
	SocketBuffer int
	// AbortWait bounds how long a failing rank tries to hand its abort
	// frame to a neighbour before it shuts the links anyway.
	AbortWait time.Duration
	// StripeBytes is the op size from which frames are striped over every
	// stream of a link; smaller ops use the first stream only (several
	// streams pay off for bulk transfers but cost small ones latency).
	StripeBytes int
	// Spin is how long a link's reader polls a quiet socket before it
	// sleeps; 0 never polls. A few tens of microseconds save a small
	// collective the CPU wake-up per hop; see spin.go.
	Spin   time.Duration
	Logger *slog.Logger
}

// Limits that no configuration may exceed: frames land in buffers
// allocated at New, so these bound the memory a Ring holds.
const (
	minSegmentBytes = 64
	maxSegmentBytes = 64 << 20
	// A whole-buffer frame longer than the op writes itself went through
	// the writer goroutine and measured several times slower than the
	// ring (docs/TUNING.md, section 17).
	maxSmallBytes = directBytes
)

// StripeSegments is the stripe threshold collectived derives from the
// segment size (StripeBytes = StripeSegments × SegmentBytes): measured on
// loopback, several streams double busbw from 16 MiB up and already gain
// at 2-3 MiB, but cost 1-1.5 MiB ops 40-60% (docs/TUNING.md, sections 5
// and 19). Peers must agree on it: changing it changes the ring
// handshake's version (rendezvous.ProtocolVersion).
const StripeSegments = 4

// DefaultSegmentBytes is the pipeline segment collectived uses unless
// configured otherwise (config.DefaultSegmentBytes refers to it): with two
// streams per link, 512 KiB segments measured best on loopback (world 2,
// 64 MiB busbw 2.1-2.4 GB/s against 1.56 with one stream of 1 MiB;
// docs/BENCHMARKS.md, "Tuning").
const DefaultSegmentBytes = 512 << 10

// DefaultConfig returns a Config for a single rank with collectived's
// defaults.
func DefaultConfig() Config {
	return Config{
		Rank:              0,
		Size:              1,
		SegmentBytes:      DefaultSegmentBytes,
		SmallBytes:        64 << 10,
		OpTimeout:         60 * time.Second,
		HeartbeatInterval: time.Second,
		HeartbeatTimeout:  10 * time.Second,
		MaxGatherBytes:    1 << 30,
		AbortWait:         time.Second,
	}
}

// Verify reports the first field that is out of range, by name.
func (c Config) Verify() error {
	switch {
	case c.Size < 1:
		return fmt.Errorf("ring config: size %d, want >= 1", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("ring config: rank %d outside world of %d", c.Rank, c.Size)
	case c.Local < 0:
		return fmt.Errorf("ring config: local %d, want >= 0", c.Local)
	case c.SegmentBytes < minSegmentBytes || c.SegmentBytes > maxSegmentBytes || c.SegmentBytes%8 != 0:
		return fmt.Errorf("ring config: segment_bytes %d, want a multiple of 8 in [%d, %d]", c.SegmentBytes, minSegmentBytes, maxSegmentBytes)
	case c.SmallBytes < 0 || c.SmallBytes > maxSmallBytes:
		return fmt.Errorf("ring config: small_bytes %d, want [0, %d]", c.SmallBytes, maxSmallBytes)
	case c.OpTimeout <= 0:
		return fmt.Errorf("ring config: op_timeout %v, want > 0", c.OpTimeout)
	case c.HeartbeatInterval <= 0:
		return fmt.Errorf("ring config: heartbeat_interval %v, want > 0", c.HeartbeatInterval)
	case c.HeartbeatTimeout < 2*c.HeartbeatInterval:
		return fmt.Errorf("ring config: heartbeat_timeout %v, want >= 2 x heartbeat_interval (%v)", c.HeartbeatTimeout, c.HeartbeatInterval)
	case c.MaxGatherBytes <= 0:
		return fmt.Errorf("ring config: max_gather_bytes %d, want > 0", c.MaxGatherBytes)
	case c.SocketBuffer < 0:
		return fmt.Errorf("ring config: socket_buffer %d, want >= 0", c.SocketBuffer)
	case c.StripeBytes < 0:
		return fmt.Errorf("ring config: stripe_bytes %d, want >= 0", c.StripeBytes)
	case c.Spin < 0 || c.Spin > 10*time.Millisecond:
		return fmt.Errorf("ring config: spin %v, want 0 to 10ms", c.Spin)
	case c.AbortWait <= 0:
		return fmt.Errorf("ring config: abort_wait %v, want > 0", c.AbortWait)
	}
	return nil
}
