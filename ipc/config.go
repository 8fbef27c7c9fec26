package ipc

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// ServerConfig configures a Server. Start from DefaultServerConfig.
type ServerConfig struct {
	// Path of the socket file. Its directory is created with mode 0750 if
	// missing (an existing directory keeps its mode).
	Path string
	// Mode of the socket file (permission bits only).
	Mode os.FileMode
	// BindTimeout is how long Listen waits for a live daemon answering on
	// Path to go (one being restarted may still be shutting down); 0
	// tries once.
	BindTimeout time.Duration
	// AllowedUIDs and AllowedGIDs admit peers by SO_PEERCRED: root and the
	// daemon's own uid always, any uid listed, and any peer whose primary
	// gid is listed (the kernel reports no supplementary groups). Empty
	// lists admit root and the daemon's own uid only.
	AllowedUIDs, AllowedGIDs []uint32
	// HelloTimeout bounds the wait for a connection's first frame.
	HelloTimeout time.Duration
	// WriteTimeout bounds each frame written to a client; a client that
	// stops reading for longer is disconnected.
	WriteTimeout time.Duration
	// Spin is how long a session's reader polls a quiet connection for the
	// client's next request before it sleeps (Conn.SetSpin); 0 never polls.
	Spin time.Duration
	// RearmMinBytes is the smallest call after whose answer the session
	// re-arms its reader's poll (Conn.Rearm), so that the client's next
	// call, which follows at once, finds the reader polling; 0 re-arms
	// after every call. DefaultServerConfig sets DefaultRearmMinBytes. A
	// daemon serving several trainers on its node sets 0: there every
	// call waits for the other trainers' calls as well as for the ring,
	// long enough for its reader to park (docs/TUNING.md, section 15).
	RearmMinBytes uint64
	// InlineLimit is the largest buffer that travels inside CALL/CALL_OK.
	InlineLimit int
	// MaxInFlight is the number of calls a connection may have outstanding.
	MaxInFlight int
	// ShmQuota is the bytes of segments one connection may hold at once.
	ShmQuota int64
	// MaxSegments is how many segments one connection may hold at once:
	// each costs the daemon an fd and a mapping.
	MaxSegments int
	// MaxClients bounds concurrent connections, observers included.
	MaxClients int
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
}

// Default values (DefaultServerConfig).
const (
	DefaultSocketPath  = "/run/collectived/collectived.sock"
	DefaultSocketMode  = 0o660
	DefaultInlineLimit = 64 << 10
	// DefaultShmQuota is the shared memory one connection may hold unless
	// configured otherwise (config.DefaultShmQuotaBytes refers to it).
	DefaultShmQuota = 4 << 30
	// DefaultMaxInFlight is the calls one connection may have outstanding
	// (config.DefaultMaxInFlight refers to it): a training step's named
	// calls are all in flight at once, ResNet-50's 161, larger models'
	// several hundred.
	DefaultMaxInFlight = 1024
	// maxInlineLimit keeps inline_limit + FrameOverhead within a u32 with
	// a wide margin; bigger buffers belong in shared memory.
	maxInlineLimit = 16 << 20
	// minMaxFrame leaves room for STATUS_OK documents when the inline
	// limit is small.
	minMaxFrame = 64 << 10
)

// DefaultServerConfig returns the defaults: the standard socket path, mode
// 0660, own uid and root only, 5 s hello timeout, 10 s write timeout,
// 64 KiB inline limit, polls re-armed after calls of 4 MiB and more, 1024
// calls in flight (DefaultMaxInFlight), 4 GiB of segments per connection (DefaultShmQuota) in
// at most 1024 segments, 256 connections.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{
		Path:          DefaultSocketPath,
		Mode:          DefaultSocketMode,
		HelloTimeout:  5 * time.Second,
		WriteTimeout:  10 * time.Second,
		InlineLimit:   DefaultInlineLimit,
		RearmMinBytes: DefaultRearmMinBytes,
		MaxInFlight:   DefaultMaxInFlight,
		ShmQuota:      DefaultShmQuota,
		MaxSegments:   1024,
		MaxClients:    256,
	}
}

// Verify reports the first field that is out of range.
func (c ServerConfig) Verify() error {
	switch {
	case c.Path == "":
		return errors.New("ipc: config: socket path is empty")
	case len(c.Path) > maxSocketPath:
		return fmt.Errorf("ipc: config: socket path %s is %d bytes, the limit is %d", c.Path, len(c.Path), maxSocketPath)
	case c.Mode == 0 || c.Mode&^os.ModePerm != 0:
		return fmt.Errorf("ipc: config: socket mode %v must be nonzero permission bits only", c.Mode)
	case c.BindTimeout < 0:
		return fmt.Errorf("ipc: config: bind timeout %v is negative", c.BindTimeout)
	case c.HelloTimeout <= 0:
		return fmt.Errorf("ipc: config: hello timeout %v must be positive", c.HelloTimeout)
	case c.WriteTimeout <= 0:
		return fmt.Errorf("ipc: config: write timeout %v must be positive", c.WriteTimeout)
	case c.InlineLimit < 0 || c.InlineLimit > maxInlineLimit:
		return fmt.Errorf("ipc: config: inline limit %d outside [0, %d]", c.InlineLimit, maxInlineLimit)
	case c.MaxInFlight < 1 || c.MaxInFlight > 1<<16:
		return fmt.Errorf("ipc: config: max in flight %d outside [1, 65536]", c.MaxInFlight)
	case c.ShmQuota < 0:
		return fmt.Errorf("ipc: config: shm quota %d is negative", c.ShmQuota)
	case c.MaxSegments < 1:
		return fmt.Errorf("ipc: config: max segments %d must be at least 1", c.MaxSegments)
	case c.MaxClients < 1:
		return fmt.Errorf("ipc: config: max clients %d must be at least 1", c.MaxClients)
	}
	return nil
}

// maxFrame is the max_frame the server announces.
func (c ServerConfig) maxFrame() uint32 {
	return uint32(max(c.InlineLimit+FrameOverhead, minMaxFrame))
}

// PollMaxBytes is the largest call whose answer comes within a poll
// (SetSpin), as a rule here (docs/TUNING.md, section 9). The Go client does
// not poll for the reply to a larger one: that would only take CPU from
// the collective.
const PollMaxBytes = 256 << 10

// DefaultRearmMinBytes is ServerConfig.RearmMinBytes for a daemon with one
// trainer: through a long call the reader has parked, and the trainer's
// next call comes right after the answer. Below it, with one trainer, the
// re-armed poll competes with the trainer's own wake-up (docs/TUNING.md,
// sections 9 and 11).
const DefaultRearmMinBytes = 4 << 20
