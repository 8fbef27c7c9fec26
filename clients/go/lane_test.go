package collectived_test

import (
	"testing"

	collectived "github.com/collectived/collectived/clients/go"
)

// laneOf reports what the daemon's status says of this trainer's lane.
func laneOf(t *testing.T, c *collectived.Client) bool {
	t.Helper()
	st, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range st["trainers"].([]any) {
		m := tr.(map[string]any)
		if int(m["world_rank"].(float64)) == c.Rank() {
			lane, _ := m["lane"].(bool)
			return lane
		}
	}
	t.Fatalf("status has no trainer of world rank %d: %v", c.Rank(), st["trainers"])
	return false
}

// Small calls take the connection's lane by default, and the socket with
// NoLane; the results are the same either way.
func TestLaneCarriesSmallCalls(t *testing.T) {
	for _, noLane := range []bool{false, true} {
		c, err := collectived.Dial(collectived.Options{LocalRank: -1, NoLane: noLane})
		if err != nil {
			t.Fatal(err)
		}
		if got := laneOf(t, c); got == noLane {
			t.Errorf("NoLane %v: the daemon says lane %v", noLane, got)
		}
		for i := 0; i < 100; i++ {
			x := []float32{float32(i), 2, 3}
			if err := collectived.AllReduce(c, x, collectived.Sum); err != nil {
				t.Fatalf("NoLane %v, call %d: %v", noLane, i, err)
			}
			// A world of one trainer: the sum is the trainer's own.
			if x[0] != float32(i) || x[2] != 3 {
				t.Fatalf("NoLane %v, call %d: got %v", noLane, i, x)
			}
		}
		c.Close()
	}
}

// Calls started together keep their order although the first takes the
// lane and the others the socket: the daemon numbers them as made.
func TestLaneKeepsOrder(t *testing.T) {
	c := dial(t)
	big, seg, err := collectived.AllocSlice[float32](c, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Free()
	for round := 0; round < 20; round++ {
		a, b := []float32{1}, make([]float32, 300) // b: 1200 bytes, inline on the socket
		var hs []*collectived.Handle
		for _, x := range [][]float32{a, b, big, a[:0]} {
			h, err := collectived.AllReduceAsync(c, x, collectived.Max)
			if err != nil {
				t.Fatal(err)
			}
			hs = append(hs, h)
		}
		for i := len(hs) - 1; i >= 0; i-- { // waiting in reverse changes nothing
			if err := hs[i].Wait(); err != nil {
				t.Fatalf("round %d, call %d: %v", round, i, err)
			}
		}
		for i := 1; i < len(hs); i++ {
			if hs[i].Seq() != hs[i-1].Seq()+1 {
				t.Fatalf("round %d: call %d ran as collective %d, call %d as %d: out of order", round, i-1, hs[i-1].Seq(), i, hs[i].Seq())
			}
		}
	}
}
