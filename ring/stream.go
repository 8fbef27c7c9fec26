package ring

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/collective"
)

// Tunables that are not worth a Config field: how many receive buffers a
// data stream owns and how many frames may queue for one writer.
const (
	rxBuffers = 4
	txDepth   = 4
	// readChunk bounds one payload read so that a slow but live peer's
	// progress keeps refreshing lastRead within a long frame.
	readChunk = 256 << 10
	// coalesceBytes: payloads up to this size are copied behind the header
	// and written with one syscall.
	coalesceBytes = 16 << 10
)

// direction tells which way data flows on a stream. Data and start frames
// flow forward only (toNext), except on a ring of two's duplex stream
// (duplex.go); heartbeats and aborts flow both ways.
type direction uint8

const (
	toNext   direction = iota // we write data, the peer writes control frames back
	fromPrev                  // the peer writes data, we write control frames back
)

// stream is one connection of a link, with the goroutines that own its
// read side and its write side (data frames on toNext streams,
// heartbeats on both).
type stream struct {
	r        *Ring
	idx      int
	dir      direction
	duplex   bool // data flows both ways (duplex.go)
	conn     net.Conn
	peerRank int
	peerAddr string

	// wsem is the write lock, taken by the writer goroutine and by the
	// abort; a channel so that the abort can bound its wait.
	wsem      chan struct{}
	lastWrite atomic.Int64 // unix nanoseconds
	lastRead  atomic.Int64
	// waitLocal is set while the reader waits for the local op to free a
	// receive buffer: silence then is our doing, not the peer's.
	waitLocal atomic.Bool

	// fromPrev (and duplex): received data frames, and the buffers to
	// receive into.
	free chan *rxBuf
	full chan *rxBuf
	// fromPrev, owned by the op goroutine: receiving in place
	// (inplace.go). spare holds the stream's own buffers while places
	// stand in for them; placeFree the place stand-ins not in use.
	spare     []*rxBuf
	placeFree []*rxBuf
	places    [rxBuffers]rxBuf

	// toNext (and duplex): frames queued for the writer goroutine.
	reqs chan txReq
	hb   chan struct{} // a heartbeat is due
	wbuf []byte        // header plus a coalesced small payload; used under wsem

	hbuf [headerLen]byte // heartbeat frame, owned by the writer goroutine

	// toNext: frames the op goroutine writes itself (direct.go), with
	// the state of the RawConn.Write callback. Owned by the op goroutine.
	rc           syscall.RawConn
	direct       []byte // the header, or header and coalesced payload
	directPay    []byte // a longer payload, written from the caller's buffer
	iov          [2]unix.Iovec
	directOff    int
	directErr    error
	directFull   bool
	directSummed bool // the trailer of directPay is laid out
	directFn     func(fd uintptr) bool

	// The stream small ops receive on (fromPrev stream 0, or the duplex
	// stream): lending the read side to the op goroutine (lend.go).
	lend   atomic.Int32  // lendNone, lendAsked, lendOut
	resume chan struct{} // the borrower hands the link back
	sr     *spinReader   // rd, when it polls

	rhdr       [headerLen]byte  // the header being read, owned by the reader (or the borrower)
	rtail      [trailerLen]byte // the trailer of a payload received in place, likewise
	readerDone chan struct{}    // closed when readLoop returns
	rd         io.Reader        // the conn, polled for Config.Spin before parking

	// abortSeen is set once an abort frame was read here: the peer then
	// closes the connection, and its end is expected, not a new failure.
	abortSeen atomic.Bool
}

type rxBuf struct {
	hdr  header
	buf  []byte // capacity maxPayload, preallocated; or a place (inplace.go)
	data []byte // buf[:hdr.Length]
	// place: buf is where the frame belongs in the caller's buffer, of
	// exactly the segment's length (inplace.go).
	place bool
}

type txReq struct {
	hdr     header
	payload []byte
}

// txDone reports one finished write to the op.
type txDone struct {
	stream int
	err    error
}

func newStream(r *Ring, idx int, dir direction, c net.Conn, peerRank int, peerAddr string) *stream {
	s := &stream{r: r, idx: idx, dir: dir, conn: c, peerRank: peerRank, peerAddr: peerAddr,
		wsem: make(chan struct{}, 1), readerDone: make(chan struct{}), hb: make(chan struct{}, 1)}
	s.rd = c
	if s.peerAddr == "" && c.RemoteAddr() != nil {
		s.peerAddr = c.RemoteAddr().String()
	}
	now := time.Now().UnixNano()
	s.lastRead.Store(now)
	s.lastWrite.Store(now)
	// Only data is worth a poller; a direction that carries heartbeats
	// and aborts alone is read without one.
	if dir == fromPrev {
		s.receiveData(r.maxPayload)
	} else {
		s.sendData()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
		if n := r.cfg.SocketBuffer; n > 0 {
			_ = tc.SetReadBuffer(n)
			_ = tc.SetWriteBuffer(n)
		}
	}
	return s
}

// receiveData sets the stream up to receive data frames of up to n bytes
// each: a reader that polls (Config.Spin) and rxBuffers buffers.
func (s *stream) receiveData(n int) {
	if tc, ok := s.conn.(*net.TCPConn); ok && s.r.cfg.Spin > 0 {
		if pc, err := newPollConn(tc); err != nil {
			// Read the socket itself: a parked reader is then woken by
			// the netpoller alone, later on a busy machine.
			s.r.log.Warn("ring link read without a duplicate fd", "peer_rank", s.peerRank, "peer_addr", s.peerAddr, "err", err)
		} else {
			s.conn = pc
		}
	}
	if sr, ok := newSpinReader(s.conn, s.r.cfg.Spin).(*spinReader); ok {
		s.rd, s.sr = sr, sr
	}
	s.free = make(chan *rxBuf, rxBuffers)
	s.full = make(chan *rxBuf, rxBuffers)
	for i := 0; i < rxBuffers; i++ {
		// Room for the trailer: the read of a payload's end takes it too.
		s.free <- &rxBuf{buf: make([]byte, n, n+trailerLen)}
		s.places[i].place = true
		s.placeFree = append(s.placeFree, &s.places[i])
	}
	s.spare = make([]*rxBuf, 0, rxBuffers)
}

// sendData sets the stream up to send data frames: the writer's queue
// and buffer, and the op goroutine's own writes (direct.go).
func (s *stream) sendData() {
	s.reqs = make(chan txReq, txDepth)
	s.wbuf = make([]byte, headerLen+coalesceBytes+trailerLen)
	s.rc = rawConn(s.conn)
	s.directFn = s.writeDirect
}

// makeLendable lets the op goroutine borrow the read side (lend.go): the
// stream every small op receives on, when its reader polls.
func (s *stream) makeLendable() {
	if s.sr != nil {
		s.sr.lend = &s.lend
		s.resume = make(chan struct{}, 1)
	}
}

// readLoop owns the read side of the stream until the connection fails,
// except while it lends it to the op goroutine (lend.go).
func (s *stream) readLoop() {
	defer s.r.wg.Done()
	defer close(s.readerDone)
	for {
		if s.sr != nil {
			s.sr.boundary = true
		}
		b, st := s.readFrame()
		switch st {
		case frameLend:
			if !s.lendToBorrower() {
				s.drain()
				return
			}
		case frameEndDrain:
			s.drain()
			return
		case frameEnd:
			return
		case frameOK:
			if b != nil {
				s.full <- b // never blocks: there are only rxBuffers buffers
			}
		}
	}
}

// frameStatus is how reading one frame ended.
type frameStatus uint8

const (
	frameOK       frameStatus = iota // a frame was handled (b: a data or start frame's buffer)
	frameLend                        // a borrower asked for the link at a frame boundary
	frameEnd                         // the ring failed; the stream is done
	frameEndDrain                    // the same, and the rest of the stream should be drained
)

// readFrame reads and handles one frame: a heartbeat or an abort here, a
// data or start frame returned in a free buffer for the op. It is the
// reader goroutine's step, and the borrower's while the link is lent.
func (s *stream) readFrame() (*rxBuf, frameStatus) {
	hb := s.rhdr[:]
	if _, err := io.ReadFull(s.rd, hb); err != nil {
		if err == errLend {
			return nil, frameLend
		}
		s.readFailed(err)
		return nil, frameEnd
	}
	s.lastRead.Store(time.Now().UnixNano())
	h, err := decodeHeader(hb, s.r.maxPayload)
	if errors.Is(err, ErrCorrupt) {
		err = s.corrupt(err)
	}
	if err == nil && h.Sender != uint32(s.peerRank) {
		err = badFrame("frame claims sender rank %d, want %d", h.Sender, s.peerRank)
	}
	if err == nil && s.dir == toNext && !s.duplex && (h.Kind == kindData || h.Kind == kindStart) {
		err = badFrame("%s frame on the backward direction", h.Kind)
	}
	if err != nil {
		s.r.failFrom(s, err)
		return nil, frameEndDrain
	}
	switch h.Kind {
	case kindHeartbeat:
		s.r.heard(s, &h, viaHeartbeat)
	case kindAbort:
		var reason [maxReasonLen + trailerLen]byte
		n := int(h.Length)
		if _, err := io.ReadFull(s.rd, reason[:n+trailerFor(n)]); err != nil {
			s.readFailed(err)
			return nil, frameEnd
		}
		if sum, sent := checksum(reason[:n]), trailerSum(reason[n:]); n > 0 && sum != sent {
			// The peer is failing, but what it says of it is not to be
			// trusted: the corruption is this rank's finding.
			s.r.failFrom(s, s.corrupt(fmt.Errorf("%w: abort frame payload checksum mismatch (CRC32C %#08x computed over %d bytes, %#08x sent)", ErrCorrupt, sum, n, sent)))
			return nil, frameEndDrain
		}
		s.abortSeen.Store(true)
		s.r.failFromAbort(s, h, string(reason[:h.Length]))
	case kindData, kindStart:
		// A borrower checks its own frame against its op at once
		// (accept); the reader tells the op, which may wait elsewhere.
		if h.Kind == kindData && (s.sr == nil || !s.sr.borrowed) && h.Generation == s.r.gen.Load() {
			s.r.heard(s, &h, viaData)
		}
		b := s.receive(h)
		if b == nil {
			return nil, frameEndDrain
		}
		return b, frameOK
	}
	return nil, frameOK
}

// receive reads a data or start payload and its trailer into a free
// buffer and checks the payload's checksum, chunk by chunk as it arrives
// (each chunk is summed while it is still in the cache). It returns nil
// when the ring is failing, which a payload that does not match its
// checksum makes it. The op takes the buffer only once it is checked: a
// place (inplace.go) is written before, but a mismatch fails the op
// before it returns.
func (s *stream) receive(h header) *rxBuf {
	var b *rxBuf
	select {
	case b = <-s.free:
	default:
		s.waitLocal.Store(true)
		select {
		case b = <-s.free:
		case <-s.r.dying:
		}
		s.waitLocal.Store(false)
		s.lastRead.Store(time.Now().UnixNano())
		if b == nil {
			return nil
		}
	}
	if int(h.Length) > len(b.buf) {
		// Only a place, or a buffer of rank 0's duplex stream, is shorter
		// than the longest payload: the op knows how long this segment
		// is, or the duplex stream carries frames of at most duplexBytes,
		// and the peer sent more.
		n, place := len(b.buf), b.place
		s.free <- b
		if place {
			s.r.failFrom(s, badFrame("data frame of %d bytes where a segment of %d was due (seq %d, step %d)", h.Length, n, h.Seq, h.Step))
		} else {
			s.r.failFrom(s, badFrame("data frame of %d bytes on the duplex stream, which carries frames of at most %d (seq %d, step %d)", h.Length, n, h.Seq, h.Step))
		}
		return nil
	}
	b.hdr = h
	b.data = b.buf[:h.Length]
	n := len(b.data)
	if n == 0 {
		return b // no payload, no trailer
	}
	// A receive buffer has room behind the payload: the last read takes
	// the trailer too. A place has none; its trailer is read on its own.
	tail := s.rtail[:]
	inline := cap(b.buf) >= n+trailerLen
	var sum uint32
	for off := 0; off < n; {
		end := min(off+readChunk, n)
		to := end
		if end == n && inline {
			to += trailerLen
		}
		var err error
		if sum, err = readSummed(s.rd, b.buf[off:to], end-off, sum); err != nil {
			s.free <- b
			s.readFailed(err)
			return nil
		}
		s.lastRead.Store(time.Now().UnixNano())
		off = end
	}
	if inline {
		tail = b.buf[n : n+trailerLen]
	} else if _, err := io.ReadFull(s.rd, tail); err != nil {
		s.free <- b
		s.readFailed(err)
		return nil
	}
	if sent := trailerSum(tail); sum != sent {
		s.free <- b
		s.r.failFrom(s, s.corrupt(fmt.Errorf("%w: %s frame payload checksum mismatch (CRC32C %#08x computed over %d bytes, %#08x sent; seq %d, step %d)",
			ErrCorrupt, h.Kind, sum, n, sent, h.Seq, h.Step)))
		return nil
	}
	return b
}

// readSummed reads len(p) bytes into p, as io.ReadFull does, and extends
// sum with the first n of them as they arrive: at least sumPiece at a
// time (shorter runs sum more slowly), while they are in the cache and
// the rest is still on its way.
func readSummed(r io.Reader, p []byte, n int, sum uint32) (uint32, error) {
	got, summed := 0, 0
	var err error
	for got < len(p) && err == nil {
		var k int
		k, err = r.Read(p[got:])
		got += k
		if end := min(got, n); end-summed >= sumPiece || (end == n && summed < n) {
			sum = sumUpdate(sum, p[summed:end])
			summed = end
		}
	}
	switch {
	case got == len(p):
		err = nil
	case got > 0 && err == io.EOF:
		err = io.ErrUnexpectedEOF
	}
	return sum, err
}

// sumPiece is the least readSummed sums at once: hash/crc32 sums runs of
// a few KiB three ways at once, shorter ones byte after byte.
const sumPiece = 32 << 10

// corrupt adds the link to a corruption found on the stream: the error
// (and the abort frame's reason, which every rank reports) names both
// ends, and an owner can name their nodes.
func (s *stream) corrupt(err error) error {
	return fmt.Errorf("%w on the link from rank %d to rank %d", err, s.peerRank, s.r.rank)
}

// drain keeps reading after the ring failed, so that the peer's last
// frames (an abort among them) are consumed and closing sends no reset.
func (s *stream) drain() {
	_, _ = io.Copy(io.Discard, s.conn)
}

func (s *stream) readFailed(err error) {
	select {
	case <-s.r.dying:
		return
	default:
	}
	if s.abortSeen.Load() {
		return // the aborting peer closing; its abort already counts
	}
	s.r.failFrom(s, connError(err))
}

// connError classifies a socket error: an orderly or abrupt close by the
// peer becomes ErrPeerClosed; anything else keeps its own text.
func connError(err error) error {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.ErrClosedPipe), errors.Is(err, net.ErrClosed):
		return &wrapped{sentinel: ErrPeerClosed, err: err}
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &wrapped{sentinel: ErrPeerHung, err: err}
	}
	return err
}

// wrapped joins a sentinel and the underlying error without repeating
// text the sentinel already says.
type wrapped struct {
	sentinel error
	err      error
}

func (w *wrapped) Error() string   { return w.sentinel.Error() + " (" + w.err.Error() + ")" }
func (w *wrapped) Unwrap() []error { return []error{w.sentinel, w.err} }

func badFrame(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadFrame}, args...)...)
}

// writeLoop owns the write side of a stream: data frames (toNext only)
// and heartbeats. It reports every data request on r.done, also after a
// failure, so the op knows when the caller's buffer is no longer read.
// Aborts bypass it (see sendAbort): it may be stuck in a write.
func (s *stream) writeLoop() {
	defer s.r.wg.Done()
	for {
		select {
		case req := <-s.reqs: // nil, never ready, where no data is sent
			err := s.writeData(&req)
			s.r.done <- txDone{stream: s.idx, err: err}
		case <-s.hb:
			s.writeHeartbeat()
		case <-s.r.stop:
			return
		}
	}
}

// frame lays a frame out in wbuf, which the caller holds (wsem): the
// header, with the payload and its trailer behind it when the payload is
// at most coalesceBytes (summed from the copy). rest is the payload still
// to write after head, nil when it was copied; its trailer (tail) goes out
// after it, summed once rest is written: the write has just brought its
// bytes into the cache, where the sender finds them before the kernel
// otherwise (measured: summed first, cold, the sum cost twice as much).
func (s *stream) frame(h *header, payload []byte) (head, rest []byte) {
	h.encode(s.wbuf[:headerLen])
	if len(payload) <= coalesceBytes {
		n := copy(s.wbuf[headerLen:], payload)
		if n > 0 {
			putTrailer(s.wbuf[headerLen+n:], checksum(s.wbuf[headerLen:headerLen+n]))
			n += trailerLen
		}
		return s.wbuf[:headerLen+n], nil
	}
	return s.wbuf[:headerLen], payload
}

// tail is where a payload frame left to write (rest) has its trailer
// laid out: behind the header in wbuf, which the payload did not take.
func (s *stream) tail() []byte { return s.wbuf[headerLen : headerLen+trailerLen] }

func (s *stream) writeData(req *txReq) error {
	select {
	case <-s.r.dying:
		return ErrClosed
	case s.wsem <- struct{}{}:
	}
	defer func() { <-s.wsem }()
	head, rest := s.frame(&req.hdr, req.payload)
	_, err := s.conn.Write(head)
	if err == nil && rest != nil {
		_, err = s.conn.Write(rest)
		if err == nil {
			putTrailer(s.tail(), checksum(rest))
			_, err = s.conn.Write(s.tail())
		}
	}
	s.lastWrite.Store(time.Now().UnixNano())
	if err != nil {
		s.writeFailed(err)
	}
	return err
}

// writeFailed fails the ring for a write error, unless the reader of the
// same connection explains it first: a peer that failed sends its abort
// before closing, and that abort (read by our reader) names the real
// cause, where our broken pipe would only say "closed".
func (s *stream) writeFailed(err error) {
	if s.abortSeen.Load() {
		return // the aborting peer closing; its abort already counts
	}
	t := time.NewTimer(s.r.cfg.AbortWait)
	defer t.Stop()
	select {
	case <-s.r.dying:
	case <-s.readerDone:
		s.r.failFrom(s, connError(err))
	case <-t.C:
		s.r.failFrom(s, connError(err))
	}
}

// heartbeat asks the writer for a heartbeat if the stream has been
// silent for an interval. It never blocks: a write may wait on a peer
// that is not reading (and need not be hung: its owner may be slow to
// call), and the heartbeat loop must go on serving the other streams.
func (s *stream) heartbeat(now time.Time) {
	if now.UnixNano()-s.lastWrite.Load() < int64(s.r.cfg.HeartbeatInterval) {
		return
	}
	select {
	case s.hb <- struct{}{}:
	default:
	}
}

func (s *stream) writeHeartbeat() {
	select {
	case <-s.r.dying:
		return
	case s.wsem <- struct{}{}:
	}
	defer func() { <-s.wsem }()
	h := header{Kind: kindHeartbeat, Sender: uint32(s.r.rank), Generation: s.r.gen.Load()}
	s.r.announce(&h)
	h.encode(s.hbuf[:])
	_, err := s.conn.Write(s.hbuf[:])
	s.lastWrite.Store(time.Now().UnixNano())
	if err != nil {
		s.writeFailed(err)
	}
}

// hung reports whether the peer has been silent on this stream for longer
// than the heartbeat timeout while we were ready to read.
func (s *stream) hung(now time.Time) bool {
	if s.waitLocal.Load() {
		return false
	}
	if s.lend.Load() == lendOut && collective.Op(s.r.curOp.Load()) == collective.OpInvalid {
		// Lent and between ops: nobody reads, and the borrower gives the
		// link back as soon as its calls pause (AllReduceLent). (A link
		// kept lent through an op that reads the other one goes back to
		// its reader once anything waits on it, reclaimIdle: silence
		// there is the peer's.)
		return false
	}
	return now.UnixNano()-s.lastRead.Load() > int64(s.r.cfg.HeartbeatTimeout)
}

// sendAbort writes an abort frame if the write lock can be had within
// AbortWait, and keeps the lock: nothing may follow an abort. If the lock
// cannot be had, a write is stuck on a peer that does not read; the
// connection is closed at once, which also frees that write.
// forwardAbort writes a deferred abort frame between the op's data
// frames, leaving the stream open. It gives up after AbortWait (the abort
// is sent again, with the links' shutdown, when the op ends).
func (s *stream) forwardAbort(frame []byte) {
	t := time.NewTimer(s.r.cfg.AbortWait)
	defer t.Stop()
	select {
	case s.wsem <- struct{}{}:
	case <-t.C:
		return
	}
	defer func() { <-s.wsem }()
	_ = s.conn.SetWriteDeadline(time.Now().Add(s.r.cfg.AbortWait))
	_, _ = s.conn.Write(frame)
	_ = s.conn.SetWriteDeadline(time.Time{})
}

func (s *stream) sendAbort(frame []byte) {
	if h := s.r.hungPeer.Load(); h != 0 && int(h-1) == s.peerRank {
		_ = s.conn.Close() // ends a write blocked on the hung peer, too
		return
	}
	t := time.NewTimer(s.r.cfg.AbortWait)
	defer t.Stop()
	select {
	case s.wsem <- struct{}{}:
	case <-t.C:
		_ = s.conn.Close()
		return
	}
	_ = s.conn.SetWriteDeadline(time.Now().Add(s.r.cfg.AbortWait))
	if _, err := s.conn.Write(frame); err != nil {
		_ = s.conn.Close()
		return
	}
	if cw, ok := s.conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}
