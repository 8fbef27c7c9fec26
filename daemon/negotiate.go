package daemon

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/collectived/collectived/collective"
)

// A negotiation round: every node offers the names ready on it (every
// local trainer has called them) in one block, the blocks are gathered
// around the ring (one allgather, no coordinator round trip), and every
// node computes from the same N blocks the same list of names ready on
// every node, in ring rank 0's order. So every node runs the same ring
// operations in the same order, whatever order each trainer called in.
//
// A name whose description is in the response cache (namecache.go) goes
// as one bit; the others go as entries, at most roundEntries per round
// (the rest wait for the next: those with the smallest hashes go first,
// so that nodes with the same names ready offer the same ones, whatever
// order their trainers called in). Block layout, little-endian:
//
//	0   4  magic "CVNR"
//	4   2  entries: how many of the roundEntries slots are used
//	6   2  reserved (0)
//	8   8  cache generation: the number of names the cache has assigned
//	16  cacheBits/8  bit i set: the name of cache entry i is ready
//	..  roundEntries x entryLen: entries
//
// entry (entryLen bytes):
//
//	0   8  FNV-1a of the name
//	8   8  the description's fingerprint (collective.Desc.Fingerprint)
//	16  8  count
//	24  4  root
//	28  1  op, 29 dtype, 30 reduce
//	31  1  name length shown (at most entryName)
//	32  entryName bytes of the name, for messages and status
const (
	roundMagic   = "CVNR"
	cacheBits    = 1024
	roundEntries = 64
	entryName    = 96
	entryLen     = 32 + entryName
	roundHeader  = 16
	roundBlock   = roundHeader + cacheBits/8 + roundEntries*entryLen
)

// negotiateDesc is the ring operation of a round: every node must run it
// at the same point, so a node that runs something else there (it went
// on to an ordered call) meets a mismatch naming it. It is named, so that
// no ordered call, whatever its description, can match it and be
// answered with the nodes' blocks.
var negotiateDesc = collective.Desc{Op: collective.OpAllGather, DType: collective.Bytes, Count: roundBlock,
	Name: "collectived: named calls ready", Named: true}

// offer is one name a node offers in a round.
type offer struct {
	hash, fp   uint64
	count      uint64
	root       uint32
	op         collective.Op
	dtype      collective.DType
	reduce     collective.ReduceOp
	name       string // as far as the block shows it
	cached     bool   // it travelled as a cache bit
	cacheIndex int
}

func nameHash(s string) uint64 {
	const offset64, prime64 = 14695981039346656037, 1099511628211
	h := uint64(offset64)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * prime64
	}
	return h
}

// encodeRound writes a node's block: bits for the cached names, entries
// for the others (at most roundEntries: it returns how many names fit).
//
// When the others do not all fit, which of them go must not depend on
// the order given (rank 0's calls): two nodes with the same 128 names
// ready, called in different orders, would each offer a different 64,
// find none in common, and offer the same again every round until the
// collective timed out. The entries go to the names with the smallest
// hashes (in the order given), which every node with those names ready
// offers alike.
func encodeRound(b []byte, cache *nameCache, ready []collective.Desc) (offered int) {
	clear(b[:roundBlock])
	copy(b, roundMagic)
	le := binary.LittleEndian
	le.PutUint64(b[8:], cache.assigned)
	bits := b[roundHeader : roundHeader+cacheBits/8]
	cut := entryCut(cache, ready)
	n := 0
	for _, d := range ready {
		if i, ok := cache.lookup(d); ok {
			bits[i/8] |= 1 << (i % 8)
			offered++
			continue
		}
		h := nameHash(d.Name)
		if n == roundEntries || h > cut {
			continue
		}
		e := b[roundHeader+cacheBits/8+n*entryLen:]
		le.PutUint64(e[0:], h)
		le.PutUint64(e[8:], d.Fingerprint())
		le.PutUint64(e[16:], d.Count)
		le.PutUint32(e[24:], d.Root)
		e[28], e[29], e[30] = byte(d.Op), byte(d.DType), byte(d.Reduce)
		shown := min(len(d.Name), entryName)
		e[31] = byte(shown)
		copy(e[32:], d.Name[:shown])
		n++
		offered++
	}
	le.PutUint16(b[4:], uint16(n))
	return offered
}

// entryCut is the largest name hash that gets an entry: that of the
// roundEntries-th smallest among the names not in the cache (all of
// them when they fit).
func entryCut(cache *nameCache, ready []collective.Desc) uint64 {
	if len(ready) <= roundEntries {
		return math.MaxUint64
	}
	var hashes []uint64
	for _, d := range ready {
		if _, ok := cache.lookup(d); !ok {
			hashes = append(hashes, nameHash(d.Name))
		}
	}
	if len(hashes) <= roundEntries {
		return math.MaxUint64
	}
	slices.Sort(hashes)
	return hashes[roundEntries-1]
}

// decodeRound reads node rank's block into dst, in the block's order
// (cache bits by index, then entries). A block that does not parse is a
// peer's bug or a different build: the round fails.
func decodeRound(b []byte, rank int, cache *nameCache, dst []offer) ([]offer, error) {
	le := binary.LittleEndian
	if len(b) != roundBlock || string(b[:4]) != roundMagic {
		return dst, fmt.Errorf("node %d's block of named calls is not one (%d bytes)", rank, len(b))
	}
	if g := le.Uint64(b[8:]); g != cache.assigned {
		return dst, fmt.Errorf("node %d's cache of named calls has %d names, this node's %d: the nodes' caches diverged", rank, g, cache.assigned)
	}
	bits := b[roundHeader : roundHeader+cacheBits/8]
	for i := 0; i < cacheBits; i++ {
		if bits[i/8]&(1<<(i%8)) == 0 {
			continue
		}
		if i >= len(cache.entries) {
			return dst, fmt.Errorf("node %d offers cache entry %d, the cache has %d", rank, i, len(cache.entries))
		}
		dst = append(dst, cache.entries[i].offer(i))
	}
	n := int(le.Uint16(b[4:]))
	if n > roundEntries {
		return dst, fmt.Errorf("node %d's block of named calls has %d entries, at most %d", rank, n, roundEntries)
	}
	for k := 0; k < n; k++ {
		e := b[roundHeader+cacheBits/8+k*entryLen:]
		shown := min(int(e[31]), entryName)
		dst = append(dst, offer{
			hash: le.Uint64(e[0:]), fp: le.Uint64(e[8:]), count: le.Uint64(e[16:]), root: le.Uint32(e[24:]),
			op: collective.Op(e[28]), dtype: collective.DType(e[29]), reduce: collective.ReduceOp(e[30]),
			name: string(e[32 : 32+shown]),
		})
	}
	return dst, nil
}

// describe shows an offer as far as the block carries it.
func (o offer) describe() string {
	d := collective.Desc{Op: o.op, DType: o.dtype, Reduce: o.reduce, Count: o.count, Root: o.root, Name: o.name, Named: true}
	return d.String()
}

// roundResult is what every node concludes from the N blocks.
type roundResult struct {
	// run lists the hashes of the names ready on every node, in ring rank
	// 0's order.
	run []uint64
	// waiting maps a name offered by some node but not all to the nodes
	// that offered it (for the stall report).
	waiting map[uint64]waitingName
}

type waitingName struct {
	o      offer
	offers []bool // by node
}

// intersect computes the round's result from every node's offers. Two
// nodes offering one name with different descriptions is a mismatch,
// found alike on every node.
func intersect(offers [][]offer, res *roundResult) error {
	res.run = res.run[:0]
	clear(res.waiting)
	if res.waiting == nil {
		res.waiting = make(map[uint64]waitingName)
	}
	n := len(offers)
	byNode := make([]map[uint64]offer, n)
	for j := range offers {
		byNode[j] = make(map[uint64]offer, len(offers[j]))
		for _, o := range offers[j] {
			byNode[j][o.hash] = o
		}
	}
	for j := range offers {
		for _, o := range offers[j] {
			if _, seen := res.waiting[o.hash]; seen {
				continue
			}
			w := waitingName{o: o, offers: make([]bool, n)}
			all := true
			for k := range offers {
				other, ok := byNode[k][o.hash]
				w.offers[k] = ok
				if !ok {
					all = false
					continue
				}
				if other.fp != o.fp {
					return fmt.Errorf("named call %q: node %d called %s but node %d called %s", o.name, j, o.describe(), k, other.describe())
				}
			}
			res.waiting[o.hash] = w
			if all && j == 0 {
				res.run = append(res.run, o.hash)
			}
		}
	}
	for _, h := range res.run {
		delete(res.waiting, h)
	}
	return nil
}
