package daemon

import (
	"fmt"
	"slices"
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
