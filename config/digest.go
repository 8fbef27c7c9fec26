package config

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
)

// shapeDomain versions the digest encoding; change it whenever the fields
// or their encoding change, so old and new daemons never agree by accident.
const shapeDomain = "collectived config shape v2\x00"

// ShapeDigest is a SHA-256 over the settings every node of a job must
// share, exchanged in the peer handshake so that a node started with a
// different config is refused with both digests named (nccl#1267).
//
// It covers, in this order and encoding: the domain string
// "collectived config shape v2\x00" naming the version of the encoding; the job name; the number of peers and each peer
// address exactly as written, in ring order; job.local_size; ring.streams,
// ring.segment_bytes and ring.small_bytes; limits.inline_bytes;
// fusion.threshold_bytes. Strings are
// length-prefixed and every number is a big-endian uint64, so no two
// configs share an encoding.
//
// It leaves out what may differ between nodes or must stay secret: the
// token (it authenticates the handshake instead), rank, listen, socket,
// timeouts, the other limits, fusion.cycle and log settings.
func (c *Config) ShapeDigest() [32]byte {
	h := sha256.New()
	var buf [8]byte
	num := func(v uint64) {
		binary.BigEndian.PutUint64(buf[:], v)
		h.Write(buf[:])
	}
	str := func(s string) {
		num(uint64(len(s)))
		h.Write([]byte(s))
	}
	h.Write([]byte(shapeDomain))
	str(c.Job.Name)
	num(uint64(len(c.Peers)))
	for _, p := range c.Peers {
		str(p)
	}
	num(uint64(c.Job.LocalSize))
	num(uint64(c.Ring.Streams))
	num(uint64(c.Ring.SegmentBytes))
	num(uint64(c.Ring.SmallBytes))
	num(uint64(c.Limits.InlineBytes))
	// Every node cuts a round's named calls into ring operations by the
	// fusion threshold: nodes that differ would meet mismatches at run
	// time, so they refuse each other at the handshake instead.
	num(uint64(c.Fusion.ThresholdBytes))
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// LogValue describes the config for slog without the token: the token's
// source (file path or variable name) is shown, never its content.
func (c *Config) LogValue() slog.Value {
	tokenFrom := "none"
	switch {
	case c.Job.TokenFile != "":
		tokenFrom = "file:" + c.Job.TokenFile
	case c.Job.TokenEnv != "":
		tokenFrom = "env:" + c.Job.TokenEnv
	}
	d := c.ShapeDigest()
	t := &c.Timeouts
	return slog.GroupValue(
		slog.String("source", c.Source()),
		slog.String("job", c.Job.Name),
		slog.String("token_from", tokenFrom),
		slog.Int("local_size", c.Job.LocalSize),
		slog.Any("peers", c.Peers),
		slog.String("rank", c.Rank.String()),
		slog.String("listen", c.Listen),
		slog.Group("socket",
			slog.String("path", c.Socket.Path),
			slog.String("mode", fmt.Sprintf("%04o", uint32(c.Socket.Mode))),
			slog.Any("allowed_uids", c.Socket.AllowedUIDs),
			slog.Any("allowed_gids", c.Socket.AllowedGIDs)),
		slog.Group("timeouts",
			slog.Duration("connect", t.Connect),
			slog.Duration("collective", t.Collective),
			slog.Duration("first_call", t.FirstCall),
			slog.Duration("stall_warning", t.StallWarning),
			slog.Duration("hello", t.Hello),
			slog.Duration("heartbeat", t.Heartbeat),
			slog.Duration("heartbeat_timeout", t.HeartbeatTimeout)),
		slog.Group("ring",
			slog.Int("streams", c.Ring.Streams),
			slog.String("segment_bytes", FormatSize(c.Ring.SegmentBytes)),
			slog.String("small_bytes", FormatSize(c.Ring.SmallBytes))),
		slog.Group("fusion",
			slog.String("threshold_bytes", FormatSize(c.Fusion.ThresholdBytes)),
			slog.Duration("cycle", c.Fusion.Cycle)),
		slog.Group("limits",
			slog.String("inline_bytes", FormatSize(c.Limits.InlineBytes)),
			slog.String("shm_quota_bytes", FormatSize(c.Limits.ShmQuotaBytes)),
			slog.Int("max_segments", c.Limits.MaxSegments),
			slog.Int("max_in_flight", c.Limits.MaxInFlight),
			slog.Int("max_clients", c.Limits.MaxClients)),
		slog.Group("log", slog.String("level", c.Log.Level), slog.String("format", c.Log.Format)),
		slog.String("shape_digest", hex.EncodeToString(d[:])),
	)
}
