package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/rendezvous"
	"github.com/collectived/collectived/ring"
)

// ErrShutdown is the cause given to calls pending when the daemon stops.
var ErrShutdown = errors.New("collectived is shutting down")

// Daemon serves one node: the Unix socket for its trainers and its place in
// the ring. It owns three goroutines, the socket server, the engine and the
// ring-stall watcher, all started by Start and stopped by Close.
type Daemon struct {
	cfg Config
	log *slog.Logger

	srv *ipc.Server
	rv  *rendezvous.Listener

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// localBufs is the engine's scratch list of a collective's local
	// buffers (owned by the engine goroutine).
	localBufs [][]byte
	// work is the engine's scratch for reduce and reduce_scatter, kept
	// for the next call of the size.
	work []byte

	// notify wakes the engine: a call arrived, a trainer left.
	notify chan struct{}

	mu       sync.Mutex
	slots    []slot
	match    *matcher[*ipc.Request] // which call joins which collective (match.go)
	ring     *ring.Ring             // the current generation's ring, nil while forming
	gen      uint32                 // the current (or last) generation
	proposal uint32                 // the generation to propose for the next ring
	state    string                 // "forming", "up", "failed", "stopped"
	lastErr  error                  // the last ring or formation failure
	lost     error                  // a trainer left mid-collective: fail collective k with this
	missed   string                 // the last failure this node judged to fail no collective (fail)
	inflight inflight               // the collective being waited for or run
	nm       namedEngine            // named calls: rounds, cache, fusion (namedrun.go)
	stallOf  time.Time              // the oldest call waiting, whose next stall warning is due at nextWarn
	nextWarn time.Duration
	closed   bool

	// The hot lane (hotlane.go).
	idle       bool           // the engine waits for calls, none queued: collective idleSeq may run inline
	idleSeq    uint64         // the collective the engine waits for
	idleRing   *ring.Ring     // the ring it waits on
	inline     bool           // a session goroutine is running a collective: the engine keeps off the ring
	inlineDone uint64         // collectives completed inline since the engine last looked
	inlineFail *inlineFailure // a collective run inline failed; the engine fails it as its own
	// afterLarge: the last collective was the engine's and not a small
	// allreduce (a larger one, a broadcast, a barrier: an op the ring does
	// not lend, so its links went back to their readers). The next small
	// call runs on the engine too (hotlane.go).
	afterLarge bool
	hotRuns    uint64       // collectives run on the hot lane since the start
	lender     *ipc.Session // the session whose goroutine holds the ring link lent by AllReduceLent

	// statusMu lets one status document be built at a time.
	statusMu sync.Mutex

	closeOnce sync.Once
	closeErr  error
}

// inflight describes the collective the engine is working on, for status.
type inflight struct {
	active bool
	seq    uint64
	phase  string          // "waiting for local calls", "in ring"
	desc   collective.Desc // rendered only when status asks
	since  time.Time
}

// New validates cfg, binds the Unix socket and the ring port, and returns a
// daemon ready to Start. Binding both before Start lets a caller report
// readiness (systemd READY=1) only once the sockets exist.
func New(cfg Config) (*Daemon, error) {
	if err := cfg.Verify(); err != nil {
		return nil, err
	}
	d := &Daemon{
		cfg:    cfg,
		log:    cfg.logger().With("job", cfg.Job, "node", cfg.Rank),
		notify: make(chan struct{}, 1),
		slots:  make([]slot, cfg.LocalSize),
		match:  newMatcher[*ipc.Request](cfg.LocalSize),
		state:  "forming",
	}

	// The rendezvous names the job and its rank itself: give it the
	// caller's logger, so that its lines carry each key once.
	rv, err := rendezvous.Listen(cfg.RendezvousConfig(cfg.logger()))
	if err != nil {
		return nil, fmt.Errorf("collectived node %d: ring listener: %w", cfg.Rank, err)
	}

	srv, err := ipc.Listen(cfg.ServerConfig(d.log))
	if err != nil {
		rv.Close()
		return nil, fmt.Errorf("collectived node %d: unix socket: %w", cfg.Rank, err)
	}
	d.rv, d.srv = rv, srv
	d.ctx, d.cancel = context.WithCancel(context.Background())
	return d, nil
}

// Start begins serving trainers and forming the ring.
func (d *Daemon) Start() {
	d.wg.Add(3)
	go func() {
		defer d.wg.Done()
		if err := d.srv.Serve(handler{d}); err != nil && !d.isClosed() {
			d.log.Error("unix socket server stopped", "err", err)
		}
	}()
	go func() {
		defer d.wg.Done()
		d.engine()
	}()
	go func() {
		defer d.wg.Done()
		d.watchRing()
	}()
	d.log.Info("collectived started", "nodes", len(d.cfg.Peers),
		"local_size", d.cfg.LocalSize, "socket", d.cfg.SocketPath, "listen", d.RingAddr())
	d.warnFDLimit()
	d.warnMapLimit("/proc/sys/vm/max_map_count")
}

// Close stops the daemon: pending calls fail with ErrShutdown, the ring and
// the listeners close, the socket file is removed. It is idempotent.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		r := d.ring
		d.mu.Unlock()
		d.cancel()
		if r != nil {
			r.Abort(failKind(ring.ErrShutdown, "node %d is shutting down", d.cfg.Rank))
		}
		d.wake()
		errSrv := d.srv.Close()
		errRv := d.rv.Close()
		done := make(chan struct{})
		go func() { d.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(d.cfg.ShutdownTimeout):
			d.log.Error("shutdown timed out; leaving goroutines behind", "timeout", d.cfg.ShutdownTimeout)
		}
		d.closeErr = errors.Join(errSrv, errRv)
		d.setState("stopped", nil)
	})
	return d.closeErr
}

func (d *Daemon) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// wake nudges the engine without blocking.
func (d *Daemon) wake() {
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

func (d *Daemon) setState(state string, err error) {
	d.mu.Lock()
	d.state = state
	if err != nil {
		d.lastErr = err
	}
	gen := d.gen
	d.mu.Unlock()
	if d.cfg.OnState != nil {
		msg := fmt.Sprintf("ring %s, generation %d, node %d of %d", state, gen, d.cfg.Rank, len(d.cfg.Peers))
		if err != nil {
			msg += ": " + err.Error()
		}
		d.cfg.OnState(msg)
	}
}

// SocketPath is where trainers connect.
func (d *Daemon) SocketPath() string { return d.cfg.SocketPath }

// RingAddr is the bound ring listener address; a world of one binds none.
func (d *Daemon) RingAddr() string {
	if a := d.rv.Addr(); a != nil {
		return a.String()
	}
	return "none (world of one)"
}
