package main

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
)

// What `collectived bench --op` measures: any collective of the protocol
// but barrier, and how each is checked. A size is each trainer's input
// buffer for allreduce, reduce and broadcast, each trainer's block for
// allgather (the result is world x size), and the whole input for
// reduce_scatter (each trainer's result is size / world).

var opFlag = &cli.StringFlag{Name: "op", Value: "allreduce", Usage: "the collective: allreduce, allgather, reducescatter (or reduce_scatter), reduce (to world rank 0) or broadcast (from world rank 0); " +
	"sum, prod, max, min or avg is an allreduce with that reduce op, as --op was before it named collectives. " +
	"Sizes are each trainer's buffer (allreduce, reduce, broadcast), each trainer's block (allgather: the result is world x size) " +
	"or the whole input (reducescatter: rounded down to a multiple of world x element size)"}

var alternateFlag = &cli.StringFlag{Name: "alternate-dtype", Usage: "a second element type measured at the same element count, call by call in turn with --dtype " +
	"(each timed iteration times one call of each, alternating which goes first), each reported in a row of its own: e.g. --dtype float32 --alternate-dtype bfloat16 " +
	"to set the 16-bit floats against float32 on the same machine at the same moments"}

var reduceFlag = &cli.StringFlag{Name: "reduce", Value: "sum", Usage: "the reduce op of allreduce, reducescatter and reduce: sum, prod, max, min or avg"}

// benchCollectives are --op's collectives by name.
var benchCollectives = map[string]collective.Op{
	"allreduce":      collective.OpAllReduce,
	"allgather":      collective.OpAllGather,
	"reducescatter":  collective.OpReduceScatter,
	"reduce_scatter": collective.OpReduceScatter,
	"reduce":         collective.OpReduce,
	"broadcast":      collective.OpBroadcast,
}

// benchRoot is the root of a measured reduce or broadcast.
const benchRoot = 0

// workload is what a bench command measures: one collective of one
// element type, reduced with op (collective.ReduceNone for allgather and
// broadcast).
type workload struct {
	coll collective.Op
	dt   collective.DType
	op   collective.ReduceOp
	// alt is --alternate-dtype's type, measured beside dt (DTypeInvalid:
	// none).
	alt collective.DType
}

// parseCollective reads --op and --reduce (reduceSet: given explicitly).
func parseCollective(opName, reduceName string, reduceSet bool) (collective.Op, collective.ReduceOp, error) {
	if coll, ok := benchCollectives[opName]; ok {
		if !coll.Reduces() {
			if reduceSet {
				return 0, 0, fmt.Errorf("--reduce %s: %s reduces nothing; leave --reduce out", reduceName, coll)
			}
			return coll, collective.ReduceNone, nil
		}
		op, err := collective.ParseReduceOp(reduceName)
		if err != nil {
			return 0, 0, fmt.Errorf("--reduce: %w", err)
		}
		return coll, op, nil
	}
	if op, err := collective.ParseReduceOp(opName); err == nil {
		if reduceSet && reduceName != opName {
			return 0, 0, fmt.Errorf("--op %s is an allreduce with reduce op %s, and --reduce says %s: give one (--op allreduce --reduce %s)", opName, opName, reduceName, reduceName)
		}
		return collective.OpAllReduce, op, nil
	}
	return 0, 0, fmt.Errorf("--op %q: want a collective (allreduce, allgather, reducescatter, reduce, broadcast) or, for an allreduce, a reduce op (sum, prod, max, min, avg)", opName)
}

// parseBenchWorkload reads --op, --reduce and --dtype, and refuses what
// the daemon would refuse (a reduction of bytes, avg of integers).
func parseBenchWorkload(c *cli.Context) (workload, error) {
	coll, op, err := parseCollective(c.String("op"), c.String("reduce"), c.IsSet("reduce"))
	if err != nil {
		return workload{}, err
	}
	dt, err := collective.ParseDType(c.String("dtype"))
	if err != nil {
		return workload{}, err
	}
	w := workload{coll: coll, dt: dt, op: op}
	if err := w.desc(0).Validate(1); err != nil {
		return workload{}, fmt.Errorf("--op %s --dtype %s: %s", c.String("op"), dt, strings.TrimPrefix(err.Error(), collective.ErrInvalid.Error()+": "))
	}
	if a := c.String("alternate-dtype"); a != "" {
		if w.alt, err = collective.ParseDType(a); err != nil {
			return workload{}, fmt.Errorf("--alternate-dtype: %w", err)
		}
		if w.alt == dt {
			return workload{}, fmt.Errorf("--alternate-dtype %s is --dtype itself: want another type", a)
		}
		x := w
		x.dt = w.alt
		if err := x.desc(0).Validate(1); err != nil {
			return workload{}, fmt.Errorf("--op %s --alternate-dtype %s: %s", c.String("op"), w.alt, strings.TrimPrefix(err.Error(), collective.ErrInvalid.Error()+": "))
		}
	}
	return w, nil
}

// args are the flags that give w to a bench-trainer or bench-ring: an
// allreduce as --op REDUCE alone, as before --op named collectives (so
// that trainers of --trainer-cmd that know only that still read it).
func (w workload) args() []string {
	var a []string
	if w.coll == collective.OpAllReduce {
		a = []string{"--op", w.op.String(), "--dtype", w.dt.String()}
	} else {
		a = []string{"--op", w.coll.String(), "--dtype", w.dt.String()}
		if w.coll.Reduces() {
			a = append(a, "--reduce", w.op.String())
		}
	}
	if w.alt.Valid() {
		a = append(a, "--alternate-dtype", w.alt.String())
	}
	return a
}

// String is how tables name w: "allreduce float32 sum".
func (w workload) String() string {
	s := w.coll.String() + " " + w.dt.String()
	switch {
	case w.coll == collective.OpReduce:
		s += fmt.Sprintf(" %s to world rank %d", w.op, benchRoot)
	case w.coll == collective.OpBroadcast:
		s += fmt.Sprintf(" from world rank %d", benchRoot)
	case w.coll.Reduces():
		s += " " + w.op.String()
	}
	if w.alt.Valid() {
		s += ", and " + w.alt.String() + " at the same element count, call by call in turn"
	}
	return s
}

// count is the element count of the input of a call of size bytes in a
// world of world trainers: at least one element, and for reduce_scatter
// a multiple of the world size (rounded down, at least one per rank).
func (w workload) count(size int64, world int) uint64 {
	n := max(size/int64(w.dt.Size()), 1)
	if w.coll == collective.OpReduceScatter {
		W := int64(max(world, 1))
		n = max(n/W*W, W)
	}
	return uint64(n)
}

func (w workload) desc(count uint64) collective.Desc {
	d := collective.Desc{Op: w.coll, DType: w.dt, Reduce: w.op, Count: count}
	if w.coll.Rooted() {
		d.Root = benchRoot
	}
	return d
}

// outBytes is the length of a call's separate result buffer: 0 for the
// collectives that work in place.
func (w workload) outBytes(count uint64, world int) int {
	es := w.dt.Size()
	switch w.coll {
	case collective.OpAllGather:
		return int(count) * world * es
	case collective.OpReduceScatter:
		return int(count) / world * es
	}
	return 0
}

// totalBytes is the full vector of a call (NCCL's size, from which algbw
// is reckoned): the gathered result of an allgather, else the input.
func (w workload) totalBytes(count uint64, world int) int64 {
	n := int64(count) * int64(w.dt.Size())
	if w.coll == collective.OpAllGather {
		n *= int64(world)
	}
	return n
}

// busFactor turns algbw into busbw by NCCL's conventions (nccl-tests,
// PERFORMANCE.md): what each rank's links carry, comparable across world
// sizes. 0 in a world of one, where nothing crosses a link.
func (w workload) busFactor(world int) float64 {
	if world <= 1 {
		return 0
	}
	W := float64(world)
	switch w.coll {
	case collective.OpAllReduce:
		return 2 * (W - 1) / W
	case collective.OpAllGather, collective.OpReduceScatter:
		return (W - 1) / W
	}
	return 1 // broadcast, reduce
}

// --- known values ------------------------------------------------------------

// narrow reports whether dt holds few exact integers (the 8-bit integers,
// the 16-bit floats): reductions of it use values from 1 to 4, so that a
// sum over the largest bench world (64 trainers, 256) and every partial
// sum on the way are exact in bfloat16; the 8-bit integers wrap, as the
// protocol has them, and the expected values wrap alike.
func narrow(dt collective.DType) bool { return dt.Size() <= 2 }

// input is what world rank r contributes at element i of its input: exact
// in dt. For allgather it is (i + 7r) mod 127 + 1, so that every rank's
// block differs; broadcast's root holds the same pattern as rank 0's
// block, the other ranks zeros (space for the result).
func (w workload) input(i, r int) float64 {
	switch w.coll {
	case collective.OpAllGather:
		return float64((i+7*r)%127 + 1)
	case collective.OpBroadcast:
		if r == benchRoot {
			return float64(i%127 + 1)
		}
		return 0
	}
	if w.op == collective.Prod {
		if (i+r)%3 == 0 {
			if w.dt == collective.Uint8 {
				return 255 // -1 modulo 256: the product stays 1 or 255
			}
			return -1
		}
		return 1
	}
	if narrow(w.dt) {
		return float64((i+r)%4 + 1)
	}
	return float64((r + 1) * (i%7 + 1))
}

// reduced is the reduction over a world of world ranks of their inputs
// at element i, exactly as dt holds it: integers wrap, a float avg is the
// sum divided once in the type's arithmetic (float32 for the 16-bit
// floats) and rounded once to dt.
func (w workload) reduced(i, world int) float64 {
	if !w.dt.Float() {
		var acc int64
		for r := 0; r < world; r++ {
			x := int64(w.input(i, r))
			switch {
			case r == 0:
				acc = x
			case w.op == collective.Sum:
				acc += x
			case w.op == collective.Prod:
				acc *= x
			case w.op == collective.Max:
				acc = max(acc, x)
			case w.op == collective.Min:
				acc = min(acc, x)
			}
		}
		return wrapInt(w.dt, acc)
	}
	var acc float64
	for r := 0; r < world; r++ {
		x := w.input(i, r)
		switch {
		case r == 0:
			acc = x
		case w.op == collective.Sum || w.op == collective.Avg:
			acc += x
		case w.op == collective.Prod:
			acc *= x
		case w.op == collective.Max:
			acc = max(acc, x)
		case w.op == collective.Min:
			acc = min(acc, x)
		}
	}
	if w.op == collective.Avg {
		if w.dt == collective.Float64 {
			acc /= float64(world)
		} else {
			acc = float64(float32(acc) / float32(world))
		}
	}
	var b [8]byte
	w.dt.Put(b[:], acc)
	return w.dt.Get(b[:])
}

// wrapInt is v as an integer dtype holds it, modulo its width.
func wrapInt(dt collective.DType, v int64) float64 {
	switch dt {
	case collective.Int8:
		return float64(int8(v))
	case collective.Uint8:
		return float64(uint8(v))
	case collective.Int32:
		return float64(int32(v))
	}
	return float64(v)
}

// benchPeriod is the period, in elements, of every known value: 84 =
// lcm(7, 4, 3) for the reductions' and 127 for allgather's and
// broadcast's. Buffers are filled and checked a period at a time.
const benchPeriod = 84 * 127

// tile is benchPeriod elements of dt: f(start), f(start+1), ...
func tile(dt collective.DType, f func(i int) float64, start int) []byte {
	es := dt.Size()
	b := make([]byte, benchPeriod*es)
	for k := 0; k < benchPeriod; k++ {
		dt.Put(b[k*es:], f(start+k))
	}
	return b
}

// fillTiled writes pat over buf, repeated.
func fillTiled(buf, pat []byte) {
	for off := 0; off < len(buf); off += len(pat) {
		copy(buf[off:], pat)
	}
}

// --- one size's check -----------------------------------------------------------

// slot is one call's buffers: in, and out for the collectives whose
// result is not their input (allgather, reduce_scatter; nil otherwise).
type slot struct{ in, out []byte }

// result is where the call leaves its result.
func (s slot) result() []byte {
	if s.out != nil {
		return s.out
	}
	return s.in
}

// check is one size's known values on one rank: what fill writes into
// every slot's input before a checked call, and what verify expects of
// every slot's result after it.
type check struct {
	w           workload
	rank, world int
	count       int // input elements
	slots       []slot
	in          []byte   // the rank's input, a period of it
	want        [][]byte // the result, a period of each block (one per world rank for allgather, else one)
	note        string   // what verify adds to a wrong result's message
	// slotNames, if not nil, name the slots in verify's errors (bench
	// --tensors: the tensors' names).
	slotNames []string
}

func newCheck(w workload, rank, world int, count uint64, slots []slot) *check {
	k := &check{w: w, rank: rank, world: world, count: int(count), slots: slots}
	input := func(r int) func(int) float64 { return func(i int) float64 { return w.input(i, r) } }
	reduced := func(i int) float64 { return w.reduced(i, world) }
	k.in = tile(w.dt, input(rank), 0)
	switch w.coll {
	case collective.OpAllGather:
		for r := 0; r < world; r++ {
			k.want = append(k.want, tile(w.dt, input(r), 0))
		}
	case collective.OpBroadcast:
		k.want = [][]byte{tile(w.dt, input(benchRoot), 0)}
	case collective.OpReduce:
		if rank == benchRoot {
			k.want = [][]byte{tile(w.dt, reduced, 0)}
		} else {
			k.want, k.note = [][]byte{k.in}, fmt.Sprintf(" (world rank %d is not the root: its buffer stays as it was)", rank)
		}
	case collective.OpReduceScatter:
		k.want = [][]byte{tile(w.dt, reduced, rank*(k.count/world))}
	default:
		k.want = [][]byte{tile(w.dt, reduced, 0)}
	}
	return k
}

// fill writes the known inputs, and zeros where separate results go (no
// expected result is zero, so a call that leaves them is caught).
func (k *check) fill() {
	for _, s := range k.slots {
		fillTiled(s.in, k.in)
		clear(s.out)
	}
}

// verify checks every slot's result, naming which of several was wrong.
func (k *check) verify() error {
	for i, s := range k.slots {
		if err := k.verifyOne(s.result()); err != nil {
			if k.slotNames != nil {
				return fmt.Errorf("%s: %w", k.slotNames[i], err)
			}
			if len(k.slots) > 1 {
				return fmt.Errorf("buffer %d of %d in flight: %w", i+1, len(k.slots), err)
			}
			return err
		}
	}
	return nil
}

func (k *check) verifyOne(got []byte) error {
	es := k.w.dt.Size()
	block := len(got) / len(k.want) // allgather: one per world rank
	for b, pat := range k.want {
		part := got[b*block : (b+1)*block]
		for off := 0; off < len(part); off += len(pat) {
			end := min(off+len(pat), len(part))
			if bytes.Equal(part[off:end], pat[:end-off]) {
				continue
			}
			for e := off; e < end; e += es {
				if !bytes.Equal(part[e:e+es], pat[e-off:e-off+es]) {
					where := ""
					if len(k.want) > 1 {
						where = fmt.Sprintf(" (world rank %d's block)", b)
					}
					return fmt.Errorf("wrong result at element %d%s: got %v, want %v%s",
						(b*block+e)/es, where, k.w.dt.Get(part[e:]), k.w.dt.Get(pat[e-off:]), k.note)
				}
			}
		}
	}
	return nil
}

// --- a trainer's buffers and calls --------------------------------------------

// trainerBufs is what a bench trainer calls at one size: k slots, in a
// segment of shared memory when any buffer is above the daemon's inline
// limit (zero copy), else in the trainer's own memory (sent inline up to
// the client's InlineMax, copied through its scratch segment above).
type trainerBufs struct {
	slots []slot
	path  string // inline, copied or shm
	call  func() error
	free  func()
}

func align64(n int) int { return (n + 63) &^ 63 }

func newTrainerBufs(cl *cvd.Client, w workload, count uint64, k int) (*trainerBufs, error) {
	nin, nout := int(count)*w.dt.Size(), w.outBytes(count, cl.Size())
	stride := align64(nin) + align64(nout)
	tb := &trainerBufs{path: "inline", free: func() {}}
	var all []byte
	if max(nin, nout) > cl.InlineLimit() {
		seg, err := cl.Alloc(stride * k)
		if err != nil {
			return nil, err
		}
		all, tb.path, tb.free = seg.Bytes(), "shm", func() { seg.Free() }
	} else {
		all = make([]byte, stride*k)
		if max(nin, nout) > cl.InlineMax() {
			tb.path = "copied"
		}
	}
	for i := 0; i < k; i++ {
		base := i * stride
		s := slot{in: all[base : base+nin : base+nin]}
		if nout > 0 {
			o := base + align64(nin)
			s.out = all[o : o+nout : o+nout]
		}
		tb.slots = append(tb.slots, s)
	}
	d := w.desc(count)
	switch s := tb.slots[0]; {
	case k > 1:
		tb.call = inFlightCall(cl, d, tb.slots)
	case s.out != nil:
		tb.call = func() error { return cl.DoInto(d, s.in, s.out) }
	default:
		tb.call = func() error { return cl.Do(d, s.in) }
	}
	return tb, nil
}
