package ring

import (
	"fmt"
	"math"

	"github.com/collectived/collectived/collective"
)

// checkCall validates a call's arguments. Argument errors are returned
// without touching the ring or its sequence: the other ranks are not
// told, so a caller that gives up on the collective should Abort.
func (r *Ring) checkCall(d *collective.Desc, op collective.Op, n int) error {
	if d.Op != op {
		return fmt.Errorf("ring rank %d: %s called with a %s description: %w", r.rank, op, d.Op, collective.ErrInvalid)
	}
	// Roots and per-rank counts are world ranks' (Config.Local to a ring
	// rank): frames carry them as the callers gave them, so that calls
	// naming two world ranks of one ring rank do not look alike.
	if err := d.Validate(r.ranks()); err != nil {
		return fmt.Errorf("ring rank %d: %s: %w", r.rank, op, err)
	}
	if n >= 0 && uint64(n) != d.Bytes() {
		return fmt.Errorf("ring rank %d: %s: buffer is %d bytes, description %s needs %d: %w",
			r.rank, op, n, d.String(), d.Bytes(), collective.ErrInvalid)
	}
	return nil
}

// Start agrees on the generation: every rank's Config.Generation proposal
// travels around the ring and all adopt the maximum. It must be called
// once, on every rank, before any op; sequence numbers start at 0.
func (r *Ring) Start() (generation uint32, err error) {
	if !r.busy.CompareAndSwap(false, true) {
		return 0, fmt.Errorf("ring rank %d: start: %w", r.rank, ErrBusy)
	}
	defer r.busy.Store(false)
	if r.started.Load() {
		return r.gen.Load(), fmt.Errorf("ring rank %d: start: already started in generation %d", r.rank, r.gen.Load())
	}
	if r.size == 1 {
		if err := r.Err(); err != nil {
			return 0, err
		}
		r.finished = r.cfg.Finished
		r.started.Store(true)
		return r.gen.Load(), nil
	}
	r.desc, r.fp, r.seq = collective.Desc{}, 0, 0
	r.sendCount, r.recvCount = 0, 0
	r.route(true) // start frames are empty
	gen, finished := r.cfg.Generation, r.cfg.Finished
	seen := uint64(startNotFresh)
	if r.cfg.Fresh {
		seen = startFresh
	}
	if r.cfg.Vacated {
		seen |= startVacated
	}
	for s := 0; s < r.size-1 && err == nil; s++ {
		r.setStep(s)
		if err = r.startFrame(gen, finished, seen); err != nil {
			break
		}
		var b *rxBuf
		if b, err = r.recv(kindStart); err != nil {
			break
		}
		gen = max(gen, b.hdr.Generation)
		finished = max(finished, b.hdr.Aux)
		seen |= b.hdr.Count & (startFresh | startNotFresh | startVacated)
		r.release(b)
	}
	if derr := r.drainWrites(); err == nil {
		err = derr
	}
	if err == nil {
		err = r.healthy()
	}
	r.curStep.Store(-1)
	if err != nil {
		return 0, r.Err()
	}
	r.gen.Store(gen)
	r.finished, r.freshSeen = finished, seen
	r.started.Store(true)
	return gen, nil
}

// Restarted reports whether Start found fresh ranks (Config.Fresh) beside
// ranks that are not: daemons restarted into a running job. A ring whose
// ranks are all fresh is a job starting.
func (r *Ring) Restarted() bool {
	return r.started.Load() && r.freshSeen&(startFresh|startNotFresh) == startFresh|startNotFresh
}

// AnyVacated reports whether some rank's Config.Vacated was set, as Start
// agreed it.
func (r *Ring) AnyVacated() bool {
	return r.started.Load() && r.freshSeen&startVacated != 0
}

// Finished is the largest Config.Finished of all ranks, as Start agreed
// it; before Start it is this rank's own.
func (r *Ring) Finished() uint64 {
	if !r.started.Load() {
		return r.cfg.Finished
	}
	return r.finished
}

// AllReduce reduces buf in place across all ranks: afterwards every
// rank's buf holds the same bytes, reduced in the order doc.go fixes.
// buf holds d.Count native little-endian elements of d.DType.
func (r *Ring) AllReduce(d collective.Desc, buf []byte) error {
	return r.allReduce(d, buf, nil, nil, false, nil)
}

// AllReduceLocal is AllReduce of several buffers of this rank: the value
// this rank contributes is the fold bufs[0] (op) bufs[1] (op) ... taken
// left to right, and every buffer ends holding the result. The fold and
// the copies back happen segment by segment, when the ring first reads
// and last writes each, so that they overlap the transfers instead of
// costing whole-buffer passes before and after them. The results are the
// bytes that folding first and calling AllReduce would give.
func (r *Ring) AllReduceLocal(d collective.Desc, bufs [][]byte) error {
	if err := r.checkLocalBufs(bufs); err != nil {
		return err
	}
	return r.allReduce(d, bufs[0], bufs[1:], nil, false, nil)
}

// AllReduceChunks is AllReduceLocal with the large path's chunks chosen
// by the caller: chunk c, the one folded around the ring starting at rank
// c, is chunks[c] elements (zero allowed), one after another. len(chunks)
// must be the ring's size and the chunks must add up to d.Count. It is
// how a fused allreduce gives every member the chunks, and so the order,
// it would get alone (Fusion). A buffer that takes the small path is
// folded in rank order whatever the chunks say. Every rank must pass the
// same chunks, as it passes the same description. No frame carries
// them, but each link carries every chunk, in one half of the op or the
// other, and its receiver checks every segment's length: chunks that
// differ fail the op with ErrBadFrame.
func (r *Ring) AllReduceChunks(d collective.Desc, bufs [][]byte, chunks []int) error {
	if err := r.checkLocalBufs(bufs); err != nil {
		return err
	}
	if err := r.checkChunks(&d, chunks); err != nil {
		return err
	}
	return r.allReduce(d, bufs[0], bufs[1:], chunks, false, nil)
}

// checkChunks checks AllReduceChunks' chunks: one per ring rank, none
// negative, d.Count in all.
func (r *Ring) checkChunks(d *collective.Desc, chunks []int) error {
	if len(chunks) != r.size {
		return fmt.Errorf("ring rank %d: %s: %d chunks for a ring of %d ranks: %w",
			r.rank, collective.OpAllReduce, len(chunks), r.size, collective.ErrInvalid)
	}
	var sum uint64
	for c, n := range chunks {
		if n < 0 {
			return fmt.Errorf("ring rank %d: %s: chunk %d has %d elements: %w", r.rank, collective.OpAllReduce, c, n, collective.ErrInvalid)
		}
		sum += uint64(n)
	}
	if sum != d.Count {
		return fmt.Errorf("ring rank %d: %s: chunks add up to %d elements, count is %d: %w",
			r.rank, collective.OpAllReduce, sum, d.Count, collective.ErrInvalid)
	}
	return nil
}

// checkLocalBufs checks AllReduceLocal's buffers: at least one, all of
// one length.
func (r *Ring) checkLocalBufs(bufs [][]byte) error {
	if len(bufs) == 0 {
		return fmt.Errorf("ring rank %d: %s of no buffers: %w", r.rank, collective.OpAllReduce, collective.ErrInvalid)
	}
	for i, b := range bufs[1:] {
		if len(b) != len(bufs[0]) {
			return fmt.Errorf("ring rank %d: %s: local buffer %d is %d bytes, buffer 0 is %d: %w",
				r.rank, collective.OpAllReduce, i+1, len(b), len(bufs[0]), collective.ErrInvalid)
		}
	}
	return nil
}

// AllReduceLent is AllReduceLocal for a caller that makes small calls in
// a row from one goroutine: a small allreduce borrows the link it
// receives on and reads it in the calling goroutine (lend.go), keeping
// it until GiveBack or the next op called otherwise. Larger calls run as
// AllReduceLocal does. It needs Config.Spin > 0 to borrow.
//
// stop, if not nil, is asked while the call waits (every millisecond
// while polling, at least at every frame and heartbeat
// otherwise): a non-nil answer aborts the ring with it, as Abort would
// from another goroutine, which the calling goroutine cannot be while it
// waits here (the daemon's session goroutine checks that its trainer is
// still connected).
func (r *Ring) AllReduceLent(d collective.Desc, bufs [][]byte, stop func() error) error {
	if err := r.checkLocalBufs(bufs); err != nil {
		return err
	}
	return r.allReduce(d, bufs[0], bufs[1:], nil, true, stop)
}

// Small reports whether an allreduce of d takes the small path, the one
// AllReduceLent runs on a borrowed link: callers that pick who runs a
// call by its size ask here rather than compare sizes of their own.
func (r *Ring) Small(d collective.Desc) bool {
	es := d.DType.Size()
	return d.Op == collective.OpAllReduce && es > 0 && d.Bytes() <= math.MaxInt && r.isSmall(int(d.Bytes()), es)
}

// isSmall tells whether an allreduce of n bytes of es-byte elements takes
// the small path (every rank's whole buffer circulates once): up to
// SmallBytes, or fewer elements than ranks.
func (r *Ring) isSmall(n, es int) bool { return n <= r.cfg.SmallBytes || n/es < r.size }

func (r *Ring) allReduce(d collective.Desc, buf []byte, others [][]byte, chunks []int, lent bool, stop func() error) error {
	if err := r.checkCall(&d, collective.OpAllReduce, len(buf)); err != nil {
		return err
	}
	return r.reduceOp(&d, buf, newFolder(&d, nil, others, true, r.ranks(), &r.f32), chunks, lent, stop)
}

// ReduceLocal is the reduction of a reduce (d.Op is collective.OpReduce,
// d.Root a world rank): ins are this rank's local inputs, folded in order as AllReduceLocal
// folds them but left unchanged; work, of the same length, receives the
// reduction on every rank. The caller copies it to the root's buffer;
// the other ranks' copies cost the ring no more time than a gather to
// the root would (its link carries as much either way).
func (r *Ring) ReduceLocal(d collective.Desc, work []byte, ins [][]byte) error {
	if err := r.checkCall(&d, collective.OpReduce, len(work)); err != nil {
		return err
	}
	if err := r.checkInputs(&d, work, ins); err != nil {
		return err
	}
	return r.reduceOp(&d, work, newFolder(&d, ins[0], ins[1:], false, r.ranks(), &r.f32), nil, false, nil)
}

// ranks is the number of world ranks the ring serves: avg's divisor, and
// the bound of roots and per-rank counts.
func (r *Ring) ranks() int { return r.size * max(r.cfg.Local, 1) }

// RingRankOf is the ring rank that serves world rank w.
func (r *Ring) RingRankOf(w int) int { return w / max(r.cfg.Local, 1) }

// reduceOp runs an allreduce or reduce of buf; chunks, if not nil, are
// the large path's chunks (AllReduceChunks), even ones otherwise.
func (r *Ring) reduceOp(d *collective.Desc, buf []byte, f folder, chunks []int, lent bool, stop func() error) error {
	lent = lent && r.size > 1 && r.isSmall(len(buf), d.DType.Size())
	if err := r.beginOp(d, lent); err != nil {
		return err
	}
	r.lentStop = stop
	var err error
	if r.size == 1 {
		f.localFinal(buf, 0)
		f.copyBack(buf, 0)
	} else if err = r.healthy(); err == nil {
		es := d.DType.Size()
		if r.isSmall(len(buf), es) {
			err = r.allReduceSmall(buf, &f)
		} else {
			err = r.allReduceRing(buf, nil, r.partitionOf(len(buf)/es, es, chunks), &f)
		}
	}
	return r.end(err)
}

// allReduceSmall circulates every rank's whole buffer once, then each
// rank folds the N buffers in rank order 0..N-1 (the same arithmetic on
// every rank, so the results are bit-identical).
func (r *Ring) allReduceSmall(buf []byte, f *folder) error {
	L := len(buf)
	f.local(buf, 0)
	copy(r.smallSlot(r.rank, L), buf)
	if err := r.circulate(L); err != nil {
		return err
	}
	f.total(buf, func(i int) []byte { return r.smallSlot(i, L) }, r.size)
	f.copyBack(buf, 0)
	return nil
}

// smallSlot is where rank i's L bytes go in the small path's scratch.
func (r *Ring) smallSlot(i, L int) []byte { return r.scratch[i*L : (i+1)*L] }

// circulate passes every rank's small slot of L bytes (its own filled)
// round the ring, N-1 steps of one frame, until each rank has all.
func (r *Ring) circulate(L int) error {
	n := r.size
	for s := 0; s < n-1; s++ {
		r.setStep(s)
		if err := r.send(kindData, r.smallSlot(mod(r.rank-s, n), L), 0); err != nil {
			return err
		}
		var b *rxBuf
		var err error
		if r.lent {
			b, err = r.recvLent(kindData)
		} else {
			b, err = r.recv(kindData)
		}
		if err != nil {
			return err
		}
		if err := r.expectLen(b, L); err != nil {
			return err
		}
		copy(r.smallSlot(mod(r.rank-s-1, n), L), b.data)
		r.release(b)
	}
	return nil
}

// allReduceRing is reduce-scatter then allgather over N chunks, each cut
// into the same number of pipeline segments. In step s of the
// reduce-scatter rank r sends chunk r-s and folds the chunk r-s-1 it
// receives into its own (received value on the left); in step t of the
// allgather it sends chunk r+1-t and overwrites chunk r-t.
//
// Local buffers (AllReduceLocal) are folded into a segment when the ring
// first touches it: the own chunk r when step 0 sends it, every other
// chunk when its partial sum arrives. A segment's final value is copied
// back when it is known: chunk r+1 as allgather step 0 sends it, every
// other chunk as it arrives.
//
// The buffers are buf (members nil), or a list's members (AllReduceList):
// a segment is then bytes of one member, whose working buffer is
// members[m][0] and whose other local buffers the folder is pointed at
// before it touches the segment.
func (r *Ring) allReduceRing(buf []byte, members [][][]byte, p partition, f *folder) error {
	n := r.size
	// Allgather segments land in the buffers themselves once their turn
	// comes (inplace.go); end stops placing.
	r.pl = placement{buf: buf, members: members, p: p, total: uint64(2 * (n - 1) * p.nseg)}
	for step := 0; step < 2*(n-1); step++ {
		r.setStep(step)
		var sendC, recvC int
		gather := step >= n-1
		if !gather {
			sendC, recvC = mod(r.rank-step, n), mod(r.rank-step-1, n)
		} else {
			t := step - (n - 1)
			sendC, recvC = mod(r.rank+1-t, n), mod(r.rank-t, n)
		}
		for j := 0; j < p.nseg; j++ {
			sm, so, sl := p.segment(sendC, j)
			src := r.pl.bufOf(sm, f)[so : so+sl]
			if step == 0 {
				f.local(src, so)
			}
			if err := r.send(kindData, src, 0); err != nil {
				return err
			}
			if step == n-1 {
				f.copyBack(src, so)
			}
			b, err := r.recv(kindData)
			if err != nil {
				return err
			}
			rm, ro, rl := p.segment(recvC, j)
			if err := r.expectLen(b, rl); err != nil {
				return err
			}
			dst := r.pl.bufOf(rm, f)[ro : ro+rl]
			switch {
			case !gather:
				// Step n-2 completes the chunk this rank finishes.
				f.combine(dst, b.data, ro, step == n-2)
			case b.place:
				// Received where it belongs (placeFor checked the
				// reduce-scatter had sent these bytes before handing
				// them to the reader).
				if rl > 0 && &b.data[0] != &dst[0] {
					return r.failLocal(r.rx[(r.recvCount-1)%r.nstreams], fmt.Errorf("internal error: segment %d of step %d was received at the wrong place", j, step))
				}
				r.inPlace++
				f.copyBack(dst, ro)
			default:
				// The bytes overwritten here were sent in reduce-scatter
				// step t; make sure that write is finished.
				if err := r.waitSent(uint64((step-(n-1))*p.nseg + j)); err != nil {
					r.release(b)
					return err
				}
				copy(dst, b.data)
				f.copyBack(dst, ro)
			}
			r.release(b)
		}
	}
	return nil
}

// partition cuts count elements into n chunks and every chunk into nseg
// segments (the first cn%nseg of a chunk of cn one element longer), nseg
// chosen so that no segment of the longest chunk exceeds segBytes: every
// chunk travels in as many frames, so that each step's sends and
// receives pair up. The chunks are even (the first count%n one element
// longer) unless starts is set: then chunk c is elements
// [starts[c], starts[c+1]) (AllReduceChunks). A list's partition (list
// set, AllReduceList) cuts each chunk into its members' pieces instead.
type partition struct {
	es, base, rem, nseg int
	starts              []int
	list                *List
}

func newPartition(count, n, es, segBytes int, starts []int) partition {
	p := partition{es: es, base: count / n, rem: count % n, starts: starts}
	maxChunk := 0
	for c := 0; c < n; c++ {
		_, cn := p.chunk(c)
		maxChunk = max(maxChunk, cn)
	}
	perSeg := segBytes / es
	p.nseg = max(1, (maxChunk+perSeg-1)/perSeg)
	return p
}

// partitionOf is the large path's partition of count elements: even
// chunks, or the given ones, whose starts go in the ring's own slice
// (reduceOp calls it after begin, when no other op can be using it).
func (r *Ring) partitionOf(count, es int, chunks []int) partition {
	if chunks == nil {
		return newPartition(count, r.size, es, r.cfg.SegmentBytes, nil)
	}
	if cap(r.chunkStarts) < r.size+1 {
		r.chunkStarts = make([]int, r.size+1)
	}
	starts := r.chunkStarts[:r.size+1]
	starts[0] = 0
	for c, cn := range chunks {
		starts[c+1] = starts[c] + cn
	}
	return newPartition(count, r.size, es, r.cfg.SegmentBytes, starts)
}

// chunk returns the element offset and length of chunk c.
func (p partition) chunk(c int) (start, n int) {
	if p.starts != nil {
		return p.starts[c], p.starts[c+1] - p.starts[c]
	}
	n = p.base
	if c < p.rem {
		n++
	}
	return c*p.base + min(c, p.rem), n
}

// segment returns segment j of chunk c: the member it belongs to (0 but
// for a list) and its byte offset and length in that member's buffers.
func (p partition) segment(c, j int) (m, off, n int) {
	if p.list != nil {
		return p.list.segment(c, j)
	}
	cs, cn := p.chunk(c)
	ss, sn := split(cn, p.nseg, j)
	return 0, (cs + ss) * p.es, sn * p.es
}

// split is part j of k of n elements (the first n%k one longer): its
// start and length.
func split(n, k, j int) (start, length int) {
	sb, sr := n/k, n%k
	start, length = j*sb+min(j, sr), sb
	if j < sr {
		length++
	}
	return start, length
}

func mod(a, n int) int { return ((a % n) + n) % n }

// Broadcast copies the root's buf into every other rank's buf. d.Root is
// the world rank of the source: ring rank d.Root / Config.Local sends
// its buf. The data flows from it round the ring in segments, each
// relayed as soon as it arrives.
func (r *Ring) Broadcast(d collective.Desc, buf []byte) error {
	if err := r.checkCall(&d, collective.OpBroadcast, len(buf)); err != nil {
		return err
	}
	if err := r.begin(&d); err != nil {
		return err
	}
	var err error
	if r.size > 1 {
		if err = r.healthy(); err == nil {
			err = r.agree()
		}
		if err == nil {
			err = r.broadcast(buf, r.RingRankOf(int(d.Root)))
		}
	}
	return r.end(err)
}

// agree runs the description check of an op whose data alone would not
// prove that every rank called it: N-1 steps of an empty frame each way
// round, as a barrier. A rank sends in step s only after it received in
// step s-1, and every receiver compares the frame's description and seq
// with its own call, so when rank r has received its last frame, the
// calls of ranks r+1, ..., r-1, r have been found equal pairwise along
// the chain: every rank's call equals every other's. Without it a
// broadcast root sends and returns at once, and a root whose peers made
// another call (another root, op, count or name) would be answered
// before any rank had compared the calls (docs/MATCHING.md).
func (r *Ring) agree() error {
	for s := 0; s < r.size-1; s++ {
		r.setStep(s)
		if err := r.send(kindData, nil, 0); err != nil {
			return err
		}
		b, err := r.recv(kindData)
		if err != nil {
			return err
		}
		if err := r.expectLen(b, 0); err != nil {
			return err
		}
		r.release(b)
	}
	return nil
}

func (r *Ring) broadcast(buf []byte, root int) error {
	seg := r.cfg.SegmentBytes
	nseg := max(1, (len(buf)+seg-1)/seg)
	r.setStep(r.size - 1) // after agree's steps
	relay := mod(r.rank+1, r.size) != root
	for j := 0; j < nseg; j++ {
		lo, hi := min(j*seg, len(buf)), min((j+1)*seg, len(buf))
		if r.rank != root {
			b, err := r.recv(kindData)
			if err != nil {
				return err
			}
			if err := r.expectLen(b, hi-lo); err != nil {
				return err
			}
			copy(buf[lo:hi], b.data)
			r.release(b)
			if !relay {
				continue
			}
		}
		if err := r.send(kindData, buf[lo:hi], 0); err != nil {
			return err
		}
	}
	return nil
}

// AllGather collects every rank's block: afterwards result[i] holds a
// copy of rank i's in. Blocks may differ in length, zero included. d must
// be the same on every rank; if d.Count > 0, len(in) must be d.Bytes().
// out is storage reused across calls (its blocks' capacity too); with
// enough capacity the call allocates nothing. Blocks longer than
// Config.MaxGatherBytes are refused.
func (r *Ring) AllGather(d collective.Desc, in []byte, out [][]byte) ([][]byte, error) {
	n := -1
	if d.Count > 0 {
		n = len(in)
	}
	if err := r.checkCall(&d, collective.OpAllGather, n); err != nil {
		return out, err
	}
	if len(in) > r.cfg.MaxGatherBytes {
		return out, fmt.Errorf("ring rank %d: allgather: block of %d bytes exceeds max_gather_bytes %d: %w",
			r.rank, len(in), r.cfg.MaxGatherBytes, collective.ErrInvalid)
	}
	if err := r.begin(&d); err != nil {
		return out, err
	}
	if cap(out) < r.size {
		out = append(out[:cap(out)], make([][]byte, r.size-cap(out))...)
	}
	out = out[:r.size]
	out[r.rank] = append(out[r.rank][:0], in...)
	var err error
	if r.size > 1 {
		if err = r.healthy(); err == nil {
			err = r.allGather(out)
		}
	}
	return out, r.end(err)
}

func (r *Ring) allGather(out [][]byte) error {
	n, seg := r.size, r.cfg.SegmentBytes
	for s := 0; s < n-1; s++ {
		r.setStep(s)
		send := out[mod(r.rank-s, n)]
		ri := mod(r.rank-s-1, n)
		out[ri] = out[ri][:0]
		nsend := max(1, (len(send)+seg-1)/seg)
		nrecv, total := -1, 0
		for j, k := 0, 0; j < nsend || nrecv < 0 || k < nrecv; {
			// Blocks differ in length, so sends and receives of a step
			// do not pair up: send while the writer has room, and when it
			// has none receive first, so that a rank pushing a long block
			// never stops draining the one coming in.
			recvDue := nrecv < 0 || k < nrecv
			if j < nsend && (!recvDue || r.canSend()) {
				lo, hi := min(j*seg, len(send)), min((j+1)*seg, len(send))
				if err := r.send(kindData, send[lo:hi], uint64(len(send))); err != nil {
					return err
				}
				j++
				continue
			}
			b, err := r.recv(kindData)
			if err != nil {
				return err
			}
			if nrecv < 0 {
				if b.hdr.Aux > uint64(r.cfg.MaxGatherBytes) {
					r.release(b)
					return r.failLocal(r.rx[(r.recvCount-1)%r.nstreams], badFrame("allgather block of %d bytes announced, limit max_gather_bytes %d", b.hdr.Aux, r.cfg.MaxGatherBytes))
				}
				total = int(b.hdr.Aux)
				nrecv = max(1, (total+seg-1)/seg)
			} else if b.hdr.Aux != uint64(total) {
				r.release(b)
				return r.failLocal(r.rx[(r.recvCount-1)%r.nstreams], badFrame("allgather block length changed from %d to %d within the block", total, b.hdr.Aux))
			}
			if err := r.expectLen(b, min((k+1)*seg, total)-min(k*seg, total)); err != nil {
				return err
			}
			out[ri] = append(out[ri], b.data...)
			r.release(b)
			k++
		}
	}
	return nil
}

// Barrier returns once every rank has entered it: an empty token
// circulates N-1 steps, after which each rank has heard from all others.
func (r *Ring) Barrier(d collective.Desc) error {
	if err := r.checkCall(&d, collective.OpBarrier, 0); err != nil {
		return err
	}
	if err := r.begin(&d); err != nil {
		return err
	}
	var err error
	if r.size > 1 {
		if err = r.healthy(); err == nil {
			err = r.agree()
		}
	}
	return r.end(err)
}
