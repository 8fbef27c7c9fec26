package collectived

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sync"
	"time"

	"github.com/collectived/collectived/ipc"
)

// DefaultSocket is where the daemon listens unless configured otherwise.
const DefaultSocket = "/run/collectived/collectived.sock"

// Options say how to attach to the daemon.
type Options struct {
	// Socket is the daemon's Unix socket; "" means $COLLECTIVED_SOCKET,
	// then DefaultSocket.
	Socket string
	// Job must equal the daemon's job name; "" means $COLLECTIVED_JOB.
	Job string
	// LocalRank is the local rank wanted, or -1 for the lowest free one.
	// The zero value asks for rank 0; use -1 explicitly for any.
	LocalRank int
	// Label is shown in the daemon's status and stall reports.
	Label string
	// Timeout bounds each call; 0 means DefaultTimeout of the daemon's
	// HELLO_OK, which outlasts the daemon's own bound on every call (so
	// its TIMEOUT, which names who has not called, arrives first).
	Timeout time.Duration
	// DialTimeout bounds connecting and HELLO; 0 means 10 s.
	DialTimeout time.Duration
	// Observer attaches without a rank, for Status only.
	Observer bool
	// Spin is how long the client polls its connection for a reply before
	// it sleeps: a small collective then avoids a thread wake-up, which
	// costs tens of microseconds on virtual machines. Calls larger than
	// ipc.PollMaxBytes never poll (their polling would only take CPU from
	// the daemons). 0 means DefaultSpin; a negative value never polls.
	Spin time.Duration
	// InlineMax is the largest call on plain memory (not in a Segment)
	// whose data travels inside the request and its answer; a larger one
	// is copied through a scratch segment of shared memory. Never more
	// than the daemon's limit (InlineLimit). 0 means DefaultInlineMax; a
	// negative value copies every call through shared memory. Calls the
	// daemon would take inline share eight scratch segments; one started
	// while all are in use goes inline.
	InlineMax int
	// NoLane keeps small calls on the socket instead of the connection's
	// lane of shared memory (docs/PROTOCOL.md, LANE), for comparison.
	NoLane bool
}

// DefaultSpin is the client's default Options.Spin.
const DefaultSpin = 200 * time.Microsecond

// DefaultInlineMax is the client's default Options.InlineMax. From a few
// kilobytes on, copying a call into shared memory and its result out costs
// less than carrying both through the socket, which copies each several
// times (docs/TUNING.md, section 18).
const DefaultInlineMax = 2048

// Client is one trainer's connection to its daemon.
type Client struct {
	conn    *ipc.Conn
	info    ipc.HelloOK
	timeout time.Duration
	socket  string

	wmu  sync.Mutex // guards wbuf and the order of writes
	wbuf []byte

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]*Handle
	segs    []*Segment
	scratch []*Segment // free scratch segments for copied calls
	err     error      // sticky: the connection is gone

	token     chan struct{} // the right to read the connection (read.go)
	closeOnce sync.Once
	spin      time.Duration // how long Wait polls for its reply before parking
	inlineMax int           // Options.InlineMax, resolved and capped by the daemon's limit
	nscratch  int           // scratch segments made for small calls (segment.go)

	lane    *ipc.Lane // nil: no lane (lane.go)
	laneBuf []byte    // a frame taken from the lane; the token's holder owns it
	laneID  uint64    // the call on the lane, 0 if none; under mu

	// The names of named calls the daemon has not answered yet, and the
	// request id of each (calls.go); under mu.
	names  map[string]uint64
	nameOf map[uint64]string
}

// Dial connects to the daemon and says HELLO.
func Dial(opts Options) (*Client, error) {
	if opts.Socket == "" {
		opts.Socket = os.Getenv("COLLECTIVED_SOCKET")
	}
	if opts.Socket == "" {
		opts.Socket = DefaultSocket
	}
	if opts.Job == "" {
		opts.Job = os.Getenv("COLLECTIVED_JOB")
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.LocalRank < -1 {
		return nil, fmt.Errorf("collectived: dial %s: local rank %d (want -1 or a rank)", opts.Socket, opts.LocalRank)
	}
	conn, info, err := dialHello(opts, ipc.Version)
	// A daemon older than this client refuses the version with VERSION,
	// fatal to that connection: ask again one version lower on a new one.
	// Each older version only lacks something (2 the first-call timeout,
	// 1 the lane too), which the client does without.
	for v := uint16(ipc.Version) - 1; v >= ipc.MinVersion && isVersionRefusal(err); v-- {
		conn, info, err = dialHello(opts, v)
	}
	if err != nil {
		return nil, err
	}
	conn.SetMaxFrame(info.MaxFrame)
	spin := opts.Spin
	switch {
	case spin == 0:
		spin = DefaultSpin
	case spin < 0:
		spin = 0
	}
	c := &Client{
		conn:    conn,
		info:    info,
		timeout: opts.Timeout,
		socket:  opts.Socket,
		nextID:  2,
		pending: make(map[uint64]*Handle),
		token:   make(chan struct{}, 1),
		spin:    spin,
	}
	c.inlineMax = resolveInlineMax(opts.InlineMax, int(info.InlineLimit))
	c.token <- struct{}{}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout(info)
	}
	if info.Version >= 2 && !opts.Observer && !opts.NoLane {
		if err := c.openLane(); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// DefaultTimeout is the wait for a call's answer that Dial takes when
// Options.Timeout is 0, from the daemon's HELLO_OK: its bound on any call,
// max(timeout_ms, first_call_timeout_ms), plus twice ipc.TimeoutMargin,
// one margin more than the daemon may take to send its TIMEOUT
// (docs/PROTOCOL.md, Timeouts). A HELLO_OK of version 1 or 2 does not
// state the first call's bound: then twice timeout_ms plus two margins,
// which with the daemon's default settings still exceeds its first-call
// timeout. Saturates at the largest Duration.
func DefaultTimeout(info ipc.HelloOK) time.Duration {
	bound, stated := info.CallBound()
	if !stated {
		bound = addSat(info.Timeout(), info.Timeout())
	}
	return addSat(bound, 2*ipc.TimeoutMargin)
}

func addSat(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// isVersionRefusal reports whether err is the daemon refusing HELLO's
// protocol version, the one refusal worth asking again.
func isVersionRefusal(err error) bool {
	var refused *helloRefused
	return errors.As(err, &refused) && errors.Is(refused.err, ipc.ErrVersion)
}

// resolveInlineMax is Options.InlineMax with its defaults, capped by the
// daemon's inline limit.
func resolveInlineMax(want, limit int) int {
	switch {
	case want == 0:
		want = DefaultInlineMax
	case want < 0:
		return -1
	}
	return min(want, limit)
}

// helloRefused is the daemon's own ERROR answer to HELLO, as against a
// fault found in its HELLO_OK: only a refusal is worth asking again.
type helloRefused struct{ err *ipc.Error }

func (r *helloRefused) Error() string { return r.err.Error() }
func (r *helloRefused) Unwrap() error { return r.err }

// dialHello connects and says HELLO in protocol version v.
func dialHello(opts Options, v uint16) (*ipc.Conn, ipc.HelloOK, error) {
	d := net.Dialer{Timeout: opts.DialTimeout}
	nc, err := d.Dial("unix", opts.Socket)
	if err != nil {
		return nil, ipc.HelloOK{}, fmt.Errorf("collectived: dial %s: %w", opts.Socket, err)
	}
	conn := ipc.NewConn(nc.(*net.UnixConn), ipc.ClientSide)
	info, err := hello(conn, opts, v)
	if err != nil {
		conn.Close()
		return nil, ipc.HelloOK{}, fmt.Errorf("collectived: hello to %s (protocol version %d): %w", opts.Socket, v, err)
	}
	return conn, info, nil
}

func hello(conn *ipc.Conn, opts Options, v uint16) (ipc.HelloOK, error) {
	deadline := time.Now().Add(opts.DialTimeout)
	conn.SetWriteTimeout(opts.DialTimeout)
	defer conn.SetWriteTimeout(0)
	h := ipc.Hello{Version: v, Observer: opts.Observer, LocalRank: int32(opts.LocalRank),
		PID: uint32(os.Getpid()), Job: opts.Job, Label: opts.Label}
	if opts.Observer {
		h.LocalRank = -1
	}
	conn.SetReadDeadline(deadline)
	if err := conn.WriteFrame(h.Encode(1), -1); err != nil {
		// A daemon that refuses us (PERMISSION) says why before it
		// closes; that reason beats our "broken pipe".
		if f, rerr := conn.ReadFrame(); rerr == nil && f.Type == ipc.TypeError {
			if e, derr := ipc.DecodeError(f.Flags, f.Payload); derr == nil {
				return ipc.HelloOK{}, &helloRefused{e}
			}
		}
		return ipc.HelloOK{}, err
	}
	defer conn.SetReadDeadline(time.Time{})
	f, err := conn.ReadFrame()
	if err != nil {
		return ipc.HelloOK{}, err
	}
	switch f.Type {
	case ipc.TypeHelloOK:
		info, err := ipc.DecodeHelloOK(f.Payload)
		if err == nil && info.Version > v {
			// It would speak frames we did not ask for (a lane in 2).
			// An older answer is taken: the connection speaks its version.
			return info, ipc.Fatalf(ipc.CodeVersion, "HELLO_OK: daemon answers in protocol version %d to a HELLO in %d", info.Version, v)
		}
		return info, err
	case ipc.TypeError:
		e, err := ipc.DecodeError(f.Flags, f.Payload)
		if err != nil {
			return ipc.HelloOK{}, err
		}
		return ipc.HelloOK{}, &helloRefused{e}
	}
	return ipc.HelloOK{}, fmt.Errorf("daemon answered HELLO with %s", f.Type)
}

// Rank is the trainer's world rank.
func (c *Client) Rank() int { return int(c.info.WorldRank) }

// Size is the number of trainers in the world.
func (c *Client) Size() int { return int(c.info.WorldSize) }

// LocalRank is the trainer's rank on its node.
func (c *Client) LocalRank() int { return int(c.info.LocalRank) }

// LocalSize is the number of trainers per node.
func (c *Client) LocalSize() int { return int(c.info.LocalSize) }

// NodeRank is the daemon's rank in the ring.
func (c *Client) NodeRank() int { return int(c.info.NodeRank) }

// NodeCount is the number of daemons in the ring.
func (c *Client) NodeCount() int { return int(c.info.NodeCount) }

// InlineLimit is the daemon's limit: the largest buffer that may travel
// inside a request.
func (c *Client) InlineLimit() int { return int(c.info.InlineLimit) }

// InlineMax is the largest call on plain memory that this client sends
// inside its request (Options.InlineMax); -1 when every call goes through
// shared memory.
func (c *Client) InlineMax() int { return c.inlineMax }

// Timeout is the longest a call waits for its answer: Options.Timeout, or
// DefaultTimeout of the daemon's HELLO_OK.
func (c *Client) Timeout() time.Duration { return c.timeout }

// Version is the protocol version the connection speaks (docs/PROTOCOL.md):
// ipc.Version, or an older one that an older daemon asked for.
func (c *Client) Version() int { return int(c.info.Version) }

// Generation is the ring generation when the client attached.
func (c *Client) Generation() uint32 { return c.info.Generation }

// closeWait bounds how long Close waits for the daemon to let go.
const closeWait = 2 * time.Second

// Close detaches from the daemon; calls in flight fail, segments are
// unmapped. It half-closes the connection and waits (at most 2 s) for the
// daemon to close its end, which it does once it has released this
// trainer's local rank: a trainer restarted right after Close finds its
// rank free. It is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		if c.err == nil {
			c.err = errClosed
		}
		c.mu.Unlock()
		if err := c.conn.UnixConn().CloseWrite(); err == nil {
			// Wait for the daemon's end: replies still coming are
			// delivered meanwhile. A goroutine reading now sees it too.
			deadline := time.Now().Add(closeWait)
			select {
			case <-c.token:
				c.drain(deadline)
				c.token <- struct{}{}
			case <-time.After(closeWait):
			}
		}
		c.fail(errClosed)
		c.mu.Lock()
		segs := c.segs
		c.segs, c.scratch = nil, nil
		c.mu.Unlock()
		for _, s := range segs {
			s.unmap()
		}
		c.closeLane()
	})
	return nil
}

// errClosed is the sticky error after Close.
var errClosed = errors.New("collectived: client closed")
