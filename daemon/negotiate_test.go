package daemon

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/collectived/collectived/collective"
)

// Two nodes with the same names ready, more than a block's entries hold,
// called in opposite orders: a round runs a block's worth, not nothing.
// (When each node offered its first roundEntries in its own order, the
// two offers were disjoint from 2*roundEntries names on, and every round
// found nothing in common until the collective timed out.)
func TestRoundOffersOverlapWhateverTheOrder(t *testing.T) {
	for _, total := range []int{roundEntries + 1, 2 * roundEntries, 3*roundEntries + 5} {
		var fwd []collective.Desc
		for i := range total {
			fwd = append(fwd, collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum,
				Count: uint64(i + 1), Name: fmt.Sprintf("layer%d.weight", i), Named: true})
		}
		rev := slices.Clone(fwd)
		slices.Reverse(rev)
		var cache nameCache
		blocks := [][]byte{make([]byte, roundBlock), make([]byte, roundBlock)}
		if n := encodeRound(blocks[0], &cache, fwd); n != roundEntries {
			t.Fatalf("%d names: node 0 offered %d, want %d", total, n, roundEntries)
		}
		encodeRound(blocks[1], &cache, rev)
		offers := make([][]offer, 2)
		for j, b := range blocks {
			var err error
			if offers[j], err = decodeRound(b, j, &cache, nil); err != nil {
				t.Fatal(err)
			}
		}
		var res roundResult
		if err := intersect(offers, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.run) != roundEntries {
			t.Errorf("%d names called in opposite orders: a round runs %d, want %d", total, len(res.run), roundEntries)
		}
		// Node 0's order: the names it offered, as its trainers called them.
		for k := 1; k < len(res.run); k++ {
			if i, j := slices.IndexFunc(fwd, func(d collective.Desc) bool { return nameHash(d.Name) == res.run[k-1] }),
				slices.IndexFunc(fwd, func(d collective.Desc) bool { return nameHash(d.Name) == res.run[k] }); i > j {
				t.Fatalf("%d names: the run is not in node 0's order", total)
			}
		}
	}
}

// A block that does not parse fails the round with an error naming the
// node and what is wrong.
func TestDecodeRoundRefusals(t *testing.T) {
	var cache nameCache
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 4, Name: "w", Named: true}
	good := func() []byte {
		b := make([]byte, roundBlock)
		encodeRound(b, &cache, []collective.Desc{d})
		return b
	}
	if offers, err := decodeRound(good(), 1, &cache, nil); err != nil || len(offers) != 1 || offers[0].name != "w" {
		t.Fatalf("a good block: %v, %+v", err, offers)
	}
	for _, c := range []struct {
		name  string
		block func() []byte
		want  string
	}{
		{"short", func() []byte { return good()[:100] }, "node 1's block of named calls is not one (100 bytes)"},
		{"magic", func() []byte { b := good(); b[0] = 'X'; return b }, "is not one"},
		{"cache size", func() []byte { b := good(); binary.LittleEndian.PutUint64(b[8:], 3); return b }, "node 1's cache of named calls has 3 names, this node's 0"},
		{"bit past the cache", func() []byte { b := good(); b[roundHeader] = 1; return b }, "node 1 offers cache entry 0, the cache has 0"},
		{"entries", func() []byte { b := good(); binary.LittleEndian.PutUint16(b[4:], roundEntries+1); return b }, "has 65 entries, at most 64"},
	} {
		if _, err := decodeRound(c.block(), 1, &cache, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}
