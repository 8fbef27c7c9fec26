package ring

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/collectived/collectived/collective"
)

// Links are one rank's established connections. Next[i] is stream i to
// rank+1 (data flows out), Prev[i] is stream i from rank-1 (data flows
// in). len(Next)==len(Prev)>=1 when Size>1, nil when Size==1. Every
// connection must be distinct (in a ring of two, Next and Prev both lead
// to the other rank but are separate connections). Conns are full
// duplex: heartbeats and aborts also flow backwards, and in a ring of
// two the short ops' data too, on rank 0's Next[0] (duplex.go). New takes ownership
// of the connections (Close closes them); if New fails they are left to
// the caller.
type Links struct {
	Next, Prev         []net.Conn
	NextAddr, PrevAddr string // for error messages; RemoteAddr() when empty
}

// Ring runs collectives for one rank over its Links. Ops (Start,
// AllReduce, Broadcast, AllGather, Barrier) are called by one goroutine
// at a time; a concurrent call returns ErrBusy without disturbing the op
// under way. Abort, Err, Status, Generation and Close may be called from
// any goroutine.
type Ring struct {
	// f32 is the 16-bit floats' float32 working space (arith.go), kept
	// here so that the op goroutine's reductions allocate nothing.
	f32 halfScratch
	// blockOffs is the block layout of the op under way (collect.go).
	blockOffs []int
	// chunkStarts is AllReduceChunks' chunk layout of the op under way.
	chunkStarts []int

	cfg        Config
	log        *slog.Logger
	rank, size int
	next, prev []*stream
	all        []*stream
	pair       []*stream // a ring of two's duplex stream (duplex.go), nil otherwise
	lenders    []*stream // the streams AllReduceLent may borrow (setupLenders)
	maxPayload int       // bound of a data frame payload and size of each receive buffer
	smallLimit int       // no allreduce on the small path is longer

	// hungPeer is 1 + the rank found hung (0: none). Its streams are closed
	// at once on failure: an abort frame cannot reach a peer that does not
	// read, and waiting AbortWait for the writer blocked on it would delay
	// this rank's own error by that much.
	hungPeer atomic.Int64

	// narrowedFrom is GOMAXPROCS before narrow, while it holds (lend.go).
	narrowedFrom atomic.Int32

	// Op state, owned by the goroutine inside an op (busy guards it).
	lent        bool         // this op reads the lent link itself (AllReduceLent)
	lentStop    func() error // AllReduceLent's stop
	nstreams    uint64       // streams this op stripes its frames over (begin)
	tx, rx      []*stream    // the streams this op sends on and receives from (route)
	busy        atomic.Bool
	started     atomic.Bool
	seq         uint64
	desc        collective.Desc
	fp          uint64
	step        int
	sendCount   uint64    // frames queued in this op, over all streams
	recvCount   uint64    // frames received in this op
	outstanding []int     // per next stream: queued, not yet reported done
	completed   []uint64  // per next stream: writes reported done in this op
	pl          placement // the allreduce under way, while it places (inplace.go)
	placed      int       // places the readers hold or will fill
	inPlace     uint64    // frames received in place, ever (tests read it)
	sentDirect  uint64    // frames the op goroutine wrote itself, ever (tests read it)
	done        chan txDone
	timer       *time.Timer
	scratch     []byte
	bufBytes    int64 // the frame buffers allocated at New (BufferBytes)

	// The op under way as heartbeats announce it, so that ranks whose
	// diverged calls exchange no data (broadcasts naming different roots)
	// still find the mismatch; peerOp carries a diverged announcement to
	// the op goroutine.
	curMu     sync.Mutex
	curHdr    header
	curActive bool
	peerOp    chan peerNote
	// The first op a neighbour was heard of at each of the last
	// peerHistory seqs (slot seq mod peerHistory), under curMu: an op
	// beginning checks its own seq's (a peer running ahead, a
	// broadcast's root, which does not wait, may be heard of at several
	// seqs before this rank reaches the first of them), and PeerInOp
	// reports the seq heard of last (peerLast; none while its slot is
	// empty), so that a rank whose own caller has not called yet learns
	// that the collective has begun elsewhere.
	peerAt   [peerHistory]peerNote
	peerLast uint64

	gen atomic.Uint32
	// finished is Start's agreed Config.Finished (set before started).
	finished  uint64
	freshSeen uint64 // startFresh | startNotFresh, as Start saw them
	// What is under way, for errors raised outside the op goroutine.
	curOp   atomic.Uint32
	curSeq  atomic.Uint64
	curStep atomic.Int64
	nextSeq atomic.Uint64 // the seq the next op will take, for Status

	mu     sync.Mutex
	err    *Error
	dying  chan struct{} // closed at the first failure
	failed time.Time     // when it failed; guarded by mu
	// deferred is an abort from a rank that had completed the op under way
	// here (it was idle after it, or in a later op): all of that op's data
	// was sent before the abort, so the op may complete; the abort takes
	// effect when it ends. Guarded by mu.
	deferred *deferredAbort
	stop     chan struct{} // closed by Close, after dying
	closing  bool
	wg       sync.WaitGroup
}

// New builds a Ring over established links. It does no I/O of its own
// but starts the goroutines that own the links: a reader and a writer per
// connection and the heartbeat loop. All ranks should call New soon after
// the links exist: a peer that sends nothing for HeartbeatTimeout is
// declared hung.
func New(cfg Config, links Links) (*Ring, error) {
	if err := cfg.Verify(); err != nil {
		return nil, err
	}
	r := &Ring{
		nstreams: 1,
		cfg:      cfg,
		log:      cfg.Logger,
		rank:     cfg.Rank,
		size:     cfg.Size,
		dying:    make(chan struct{}),
		stop:     make(chan struct{}),
		peerOp:   make(chan peerNote, 1),
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.gen.Store(cfg.Generation)
	r.curStep.Store(-1)
	if cfg.Size == 1 {
		if len(links.Next) != 0 || len(links.Prev) != 0 {
			return nil, errors.New("ring: a world of one takes no links")
		}
		return r, nil
	}
	if err := checkLinks(links); err != nil {
		return nil, err
	}
	r.smallLimit = max(cfg.SmallBytes, 8*cfg.Size)
	r.maxPayload = max(cfg.SegmentBytes, r.smallLimit)
	r.scratch = make([]byte, cfg.Size*r.smallLimit)
	S := len(links.Next)
	r.outstanding = make([]int, S)
	r.completed = make([]uint64, S)
	r.done = make(chan txDone, S*txDepth)
	r.timer = time.NewTimer(time.Hour)
	r.timer.Stop()
	nextRank, prevRank := (r.rank+1)%r.size, (r.rank+r.size-1)%r.size
	for i := 0; i < S; i++ {
		r.next = append(r.next, newStream(r, i, toNext, links.Next[i], nextRank, links.NextAddr))
		r.prev = append(r.prev, newStream(r, i, fromPrev, links.Prev[i], prevRank, links.PrevAddr))
	}
	r.all = append(append([]*stream(nil), r.next...), r.prev...)
	r.bufBytes = int64(len(r.scratch) + S*(rxBuffers*(r.maxPayload+trailerLen)+len(r.next[0].wbuf)))
	r.setupDuplex()
	r.setupLenders()
	r.tx, r.rx = r.next, r.prev
	for _, s := range r.all {
		r.wg.Add(1)
		go s.readLoop()
		r.wg.Add(1)
		go s.writeLoop()
	}
	r.wg.Add(1)
	go r.heartbeatLoop()
	return r, nil
}

func checkLinks(l Links) error {
	if len(l.Next) == 0 || len(l.Next) != len(l.Prev) {
		return fmt.Errorf("ring: links have %d next and %d prev streams, want the same number >= 1", len(l.Next), len(l.Prev))
	}
	seen := map[net.Conn]string{}
	for i, c := range l.Next {
		if c == nil {
			return fmt.Errorf("ring: next stream %d is nil", i)
		}
		if prev, dup := seen[c]; dup {
			return fmt.Errorf("ring: next stream %d is the same connection as %s", i, prev)
		}
		seen[c] = fmt.Sprintf("next stream %d", i)
	}
	for i, c := range l.Prev {
		if c == nil {
			return fmt.Errorf("ring: prev stream %d is nil", i)
		}
		if prev, dup := seen[c]; dup {
			return fmt.Errorf("ring: prev stream %d is the same connection as %s", i, prev)
		}
		seen[c] = fmt.Sprintf("prev stream %d", i)
	}
	return nil
}

// Generation is the generation adopted by Start (the proposal before).
func (r *Ring) Generation() uint32 { return r.gen.Load() }

// Err returns the first failure, nil while the ring is healthy.
func (r *Ring) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		return nil
	}
	return r.err
}

// Done is closed when the ring fails: a caller idle between ops can wait
// on it instead of polling Err.
func (r *Ring) Done() <-chan struct{} { return r.dying }

// FailedAt is when the ring failed (the zero time while it is healthy).
// Work that arrived later was not part of the failed op.
func (r *Ring) FailedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// Abort fails the ring from outside: both neighbours get an abort frame
// naming this rank and reason, and forward it, so every rank's current or
// next op fails with it. A ring that has already failed is left as it is.
func (r *Ring) Abort(reason error) {
	if reason == nil {
		reason = errors.New("aborted by its owner")
	}
	e := r.newError(nil, r.rank, &abortError{code: codeOf(reason), reason: reason.Error(), cause: reason})
	r.fail(e, reason.Error())
}

// Close fails pending and later ops with ErrClosed, tells both
// neighbours (an abort frame), closes the links and waits for the ring's
// goroutines. It is idempotent.
func (r *Ring) Close() error {
	r.mu.Lock()
	if r.closing {
		r.mu.Unlock()
		r.wg.Wait()
		return nil
	}
	r.closing = true
	r.mu.Unlock()
	e := r.newError(nil, r.rank, ErrClosed)
	r.fail(e, "rank "+strconv.Itoa(r.rank)+" closed its ring")
	close(r.stop)
	r.wg.Wait()
	r.widen()
	return nil
}

// newError describes a failure seen now, with what is under way.
func (r *Ring) newError(s *stream, origin int, cause error) *Error {
	e := &Error{
		Rank:       r.rank,
		Op:         collective.Op(r.curOp.Load()),
		Seq:        r.curSeq.Load(),
		Step:       int(r.curStep.Load()),
		Generation: r.gen.Load(),
		PeerRank:   -1,
		Origin:     origin,
		Culprit:    -1,
		Err:        cause,
	}
	if e.Op == collective.OpInvalid {
		// Idle: the seq is the next op's, so that an abort frame tells its
		// receivers that every op before it completed here.
		e.Seq = r.nextSeq.Load()
		e.Step = -1
		if !r.started.Load() && r.busy.Load() {
			e.phase = "start"
		}
	}
	if s != nil {
		e.PeerRank, e.PeerAddr = s.peerRank, s.peerAddr
	}
	return e
}

// failFrom records a failure this rank detected on stream s.
func (r *Ring) failFrom(s *stream, cause error) {
	if s != nil && errors.Is(cause, ErrPeerHung) {
		r.hungPeer.CompareAndSwap(0, int64(s.peerRank)+1)
	}
	e := r.newError(s, r.rank, cause)
	if s != nil && culpable(cause) {
		e.Culprit = s.peerRank
	}
	r.fail(e, e.reason())
}

// culpable tells the failures that are the peer's own doing (a socket
// this rank closed itself is not). A corrupted frame names its sender as
// the culprit: the link from it to this rank, or the sender itself,
// changed the bytes.
func culpable(cause error) bool {
	if errors.Is(cause, net.ErrClosed) {
		return false
	}
	return errors.Is(cause, ErrPeerClosed) || errors.Is(cause, ErrPeerHung) ||
		errors.Is(cause, ErrBadFrame) || errors.Is(cause, ErrGeneration) || errors.Is(cause, ErrCorrupt)
}

// deferredAbort is an abort kept until the op under way ends.
type deferredAbort struct {
	e      *Error
	reason string
	code   abortCode
	until  uint64 // applies once the ops before this seq have ended here
}

// failFromAbort records an abort frame received on s and forwards it.
//
// The frame's seq is the origin's op, or its next op if it was idle: every
// op before that seq had completed at the origin. If this rank has not yet
// ended such an op (it is in it, or has yet to begin it), that op's data
// is already on its way (the origin sent all of it before failing), so the
// abort is forwarded at once but fails this ring only once those ops have
// ended here: otherwise an op would fail here while it succeeded at the
// origin, and the ranks would disagree on which calls completed. A
// watchdog applies the abort anyway if that takes longer than a few
// AbortWaits.
func (r *Ring) failFromAbort(s *stream, h header, reason string) {
	origin := int(uint32(h.Aux))
	code := abortCode(uint8(h.Aux >> 32))
	e := r.newError(s, origin, &abortError{code: code, reason: reason})
	e.Culprit = int(h.Aux>>culpritShift) - 1
	e.abortSet, e.abortSeq, e.abortOp = true, h.Seq, h.Op
	r.mu.Lock()
	if r.err == nil && r.positionLocked() < h.Seq {
		first := r.deferred == nil
		if first {
			r.deferred = &deferredAbort{e: e, reason: reason, code: code, until: h.Seq}
		}
		r.mu.Unlock()
		if first {
			r.log.Info("abort from a rank past this op: finishing the op first", "rank", r.rank, "seq", r.curSeq.Load(), "abort_seq", h.Seq, "origin", origin)
			r.wg.Add(1)
			go r.forwardAbort(r.abortFrame(e, reason, code))
			// The op should end promptly (its data is in flight); if it
			// does not, the abort applies anyway.
			time.AfterFunc(4*r.cfg.AbortWait+time.Second, func() {
				r.mu.Lock()
				d := r.deferred
				r.deferred = nil
				r.mu.Unlock()
				if d != nil {
					r.failCode(d.e, d.reason, d.code)
				}
			})
		}
		return
	}
	r.mu.Unlock()
	r.failCode(e, reason, code)
}

// positionLocked is the seq of the op under way, or of the next op when
// idle: every op before it has ended here. r.mu is held, which orders it
// with endDeferred.
func (r *Ring) positionLocked() uint64 {
	if collective.Op(r.curOp.Load()) != collective.OpInvalid {
		return r.curSeq.Load()
	}
	return r.nextSeq.Load()
}

// endDeferred is called as an op ends (nextSeq already advanced): it
// clears the op under way and applies a deferred abort whose ops have all
// ended here.
func (r *Ring) endDeferred() {
	r.mu.Lock()
	r.curOp.Store(uint32(collective.OpInvalid))
	d := r.deferred
	if d != nil && r.nextSeq.Load() >= d.until {
		r.deferred = nil
	} else {
		d = nil
	}
	r.mu.Unlock()
	if d != nil {
		r.failCode(d.e, d.reason, d.code)
	}
}

// fail keeps the first error, wakes every wait, and starts the abort: an
// abort frame to both neighbours, then the links are shut.
func (r *Ring) fail(e *Error, reason string) { r.failCode(e, reason, codeOf(e.Err)) }

func (r *Ring) failCode(e *Error, reason string, code abortCode) {
	r.mu.Lock()
	if r.err != nil {
		r.mu.Unlock()
		return
	}
	r.err = e
	r.failed = time.Now()
	close(r.dying)
	r.mu.Unlock()
	r.log.Warn("ring failed", "rank", r.rank, "err", e.Error())
	if len(r.all) == 0 {
		return
	}
	r.wg.Add(1)
	go r.abortLinks(r.abortFrame(e, reason, code))
}

// abortFrame encodes the abort frame for e.
// culpritShift places an abort frame's culprit (rank + 1; 0: none) in its
// aux, above the origin (bits 0-31) and the failure code (bits 32-39).
const culpritShift = 40

func (r *Ring) abortFrame(e *Error, reason string, code abortCode) []byte {
	if len(reason) > maxReasonLen {
		reason = reason[:maxReasonLen-3] + "..."
	}
	frame := make([]byte, headerLen+len(reason)+trailerFor(len(reason)))
	seq, op := e.Seq, e.Op
	if e.abortSet {
		seq, op = e.abortSeq, e.abortOp
	}
	h := header{Kind: kindAbort, Sender: uint32(r.rank), Generation: r.gen.Load(),
		Seq: seq, Op: op, Length: uint32(len(reason)),
		Aux: uint64(uint32(e.Origin)) | uint64(code)<<32}
	if n := copy(frame[headerLen:], reason); n > 0 {
		putTrailer(frame[headerLen+n:], checksum(frame[headerLen:headerLen+n]))
	}
	if e.Culprit >= 0 && e.Culprit < 1<<(64-culpritShift)-1 {
		h.Aux |= uint64(e.Culprit+1) << culpritShift
	}
	h.encode(frame)
	return frame
}

// forwardAbort passes a deferred abort on to both neighbours without
// closing anything: the op under way still needs the links.
func (r *Ring) forwardAbort(frame []byte) {
	defer r.wg.Done()
	for _, s := range r.all {
		s.forwardAbort(frame)
	}
}

// abortLinks hands the abort frame to every stream at once (see
// sendAbort), half-closes them, and closes them once the peers have
// closed their ends (or after AbortWait): closing with unread data would
// make TCP send a reset, which can overtake the abort frame; the readers
// drain meanwhile. All links are closed within 3 x AbortWait.
func (r *Ring) abortLinks(frame []byte) {
	defer r.wg.Done()
	var wg sync.WaitGroup
	for _, s := range r.all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.sendAbort(frame)
		}()
	}
	wg.Wait()
	expired := make(chan struct{})
	t := time.AfterFunc(r.cfg.AbortWait, func() { close(expired) })
	defer t.Stop()
	for _, s := range r.all {
		select {
		case <-s.readerDone:
		case <-expired:
		}
	}
	for _, s := range r.all {
		_ = s.conn.Close()
	}
}

// heartbeatLoop sends heartbeats on silent streams and declares a peer
// hung when it has sent nothing for HeartbeatTimeout.
func (r *Ring) heartbeatLoop() {
	defer r.wg.Done()
	period := min(r.cfg.HeartbeatInterval/2, r.cfg.HeartbeatTimeout/4)
	t := time.NewTicker(max(period, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-r.dying:
			return
		case now := <-t.C:
			for _, s := range r.all {
				s.heartbeat(now)
			}
			r.reclaimIdle(nil)
			for _, s := range r.all {
				if s.hung(now) {
					r.failFrom(s, fmt.Errorf("%w (silent for more than %v)", ErrPeerHung, r.cfg.HeartbeatTimeout))
					return
				}
			}
		}
	}
}

// peerNote is a peer's op at our seq, announced in a heartbeat or seen
// in its data frame, that differs from ours; via says which, for the
// mismatch's message.
type peerNote struct {
	s   *stream
	h   header
	via string
	at  time.Time // when this rank first heard of it
}

const (
	viaHeartbeat = " (announced in a heartbeat)"
	viaData      = " (seen in its data frame)"
)

// announce stamps the op under way, if any, into a heartbeat.
func (r *Ring) announce(h *header) {
	r.curMu.Lock()
	if r.curActive {
		h.Op, h.DType, h.Reduce, h.Root, h.Count, h.NameFP, h.Seq =
			r.curHdr.Op, r.curHdr.DType, r.curHdr.Reduce, r.curHdr.Root, r.curHdr.Count, r.curHdr.NameFP, r.curHdr.Seq
	}
	r.curMu.Unlock()
}

// setCurrent records the op under way for announce (active false: none).
// An op beginning checks what the peer was seen doing at its seq before:
// a broadcast's root, for one, may have sent its frame and finished while
// this rank's op waits on another stream (a ring of two's duplex stream,
// duplex.go).
func (r *Ring) setCurrent(active bool) {
	r.curMu.Lock()
	r.curActive = active
	if active {
		r.curHdr = header{Seq: r.seq}
		r.curHdr.setDesc(&r.desc, r.fp)
		// Any note waiting is an earlier op's: heard reads curHdr under
		// curMu, which this holds. Drop it, so that it leaves room for one
		// about this op.
		select {
		case <-r.peerOp:
		default:
		}
		// heard sends only under curMu, and only about the op under way:
		// after the drain the slot is free for this op's note.
		if n := &r.peerAt[r.seq%peerHistory]; n.s != nil && n.h.Seq == r.seq && !n.h.sameCall(&r.curHdr) {
			select {
			case r.peerOp <- *n: // free: drained above, and heard sends under curMu
			default:
			}
		}
	}
	r.curMu.Unlock()
}

// peerHistory is how many seqs' first peer ops setCurrent can look back
// on. Only ops that wait for no one (a broadcast's root) take a peer
// ahead; a diverged op at seq k whose peer was heard of at seq
// k+peerHistory or later before it began is left to the op timeout.
const peerHistory = 8

// heard compares a peer's op, announced in a heartbeat or carried by a
// data frame, with ours; a different call at the same seq goes to the op
// goroutine, which reports the mismatch. The op may be waiting on another
// stream than the one this came on, so it would not read the frame itself.
func (r *Ring) heard(s *stream, h *header, via string) {
	if h.Op == collective.OpInvalid {
		return
	}
	r.curMu.Lock()
	defer r.curMu.Unlock()
	if n := &r.peerAt[h.Seq%peerHistory]; n.s == nil || n.h.Seq != h.Seq {
		*n = peerNote{s: s, h: *h, via: via, at: time.Now()}
	}
	r.peerLast = h.Seq
	if !r.curActive || r.curHdr.Seq != h.Seq || r.curHdr.sameCall(h) {
		return
	}
	// Sent under curMu, so never after the next op's setCurrent has
	// drained the slot: a stale note there would crowd out that op's own.
	select {
	case r.peerOp <- peerNote{s: s, h: *h, via: via}:
	default: // one note about this op is enough
	}
}
