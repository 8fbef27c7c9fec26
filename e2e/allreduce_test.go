package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestAllReduceWorlds runs every dtype and op over sizes from 0 to just
// past 1 MiB, through plain memory (inline up to 64 KiB, copied through a
// scratch segment beyond) and through daemon segments (zero copy), in
// worlds of 1x1, 2x1, 3x2 and 4x2 nodes x trainers. Each trainer checks
// its result against a reference it computes itself; the test checks that
// every trainer got bit-identical bytes.
func TestAllReduceWorlds(t *testing.T) {
	for _, w := range []struct{ nodes, local int }{{1, 1}, {2, 1}, {3, 2}, {4, 2}} {
		t.Run(fmt.Sprintf("%dx%d", w.nodes, w.local), func(t *testing.T) {
			wd := startWorld(t, w.nodes, w.local, "")
			trs := wd.startTrainers("-mode", "sweep")
			checkSameResults(t, trs, 4*4*7*2)
		})
	}
}

// TestAllReduce64MiB moves 64 MiB float32 sums through both paths.
func TestAllReduce64MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("64 MiB end-to-end skipped in -short")
	}
	wd := startWorld(t, 2, 2, "")
	trs := wd.startTrainers("-mode", "sweep", "-sizes", "67108864", "-dtypes", "float32", "-ops", "sum", "-paths", "shm,inline")
	checkSameResults(t, trs, 2)
}

func checkSameResults(t *testing.T, trs []*trainer, calls int) {
	t.Helper()
	var first []event
	for i, tr := range trs {
		evs, err := tr.wait(t, 5*time.Minute)
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
		if len(evs) != calls {
			t.Fatalf("trainer %d made %d calls, want %d", i, len(evs), calls)
		}
		if i == 0 {
			first = evs
			continue
		}
		for k := range evs {
			if evs[k].Hash != first[k].Hash || evs[k].Desc != first[k].Desc {
				t.Fatalf("call %d: trainer %d got %s %s, trainer 0 got %s %s", k, i, evs[k].Desc, evs[k].Hash, first[k].Desc, first[k].Hash)
			}
		}
	}
}
