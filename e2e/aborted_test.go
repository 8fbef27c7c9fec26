package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
)

// dialTrainer attaches a trainer in this test process to node's daemon.
func dialTrainer(t *testing.T, w *world, node int) *cvd.Client {
	t.Helper()
	c, err := cvd.Dial(cvd.Options{Socket: w.sockets[node], Job: "e2e", LocalRank: -1, Label: "aborted_test", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestQueuedCallsGoOn: a trainer with a second call queued behind a
// collective that fails gets the failure on the first, whatever the
// cause (the other trainer disagreeing, or disconnecting mid-collective);
// the second is its call of the next collective, which runs in the new
// generation with the other trainer's next call. Failing it too (as
// ABORTED, before) would fail two calls of one trainer and one of the
// other, and their later calls would meet out of step
// (docs/MATCHING.md).
func TestQueuedCallsGoOn(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(t *testing.T, b *cvd.Client) // makes collective 0 fail
		code  error
		cause string
	}{
		{"mismatch", func(t *testing.T, b *cvd.Client) {
			if err := cvd.AllReduce(b, make([]float32, 8), cvd.Sum); !errors.Is(err, cvd.ErrMismatch) {
				t.Errorf("the disagreeing trainer's call: %v, want MISMATCH", err)
			}
		}, cvd.ErrMismatch, "count=8"},
		{"trainer lost", func(t *testing.T, b *cvd.Client) { b.Close() }, cvd.ErrTrainerLost, "world rank 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := startWorld(t, 1, 2, "")
			a := dialTrainer(t, w, 0)
			b := dialTrainer(t, w, 0)
			first, err := cvd.AllReduceAsync(a, make([]float32, 4), cvd.Sum)
			if err != nil {
				t.Fatal(err)
			}
			x := []float32{1}
			queued, err := cvd.AllReduceAsync(a, x, cvd.Sum)
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "collective 0 to wait for world rank 1", func() bool {
				in, _ := statusJSON(t, w.sockets[0])["in_flight"].(map[string]any)
				return in != nil && strings.Contains(in["not_called"].(string), "world rank 1")
			})
			tc.fault(t, b)
			err = first.Wait()
			if !errors.Is(err, tc.code) || !strings.Contains(err.Error(), tc.cause) {
				t.Fatalf("first call: %v, want %v naming %q", err, tc.code, tc.cause)
			}
			t.Logf("first call: %v", err)

			// The world goes on in a new generation: a's queued call meets
			// b's next call.
			if tc.name == "trainer lost" {
				b = dialTrainer(t, w, 0)
			}
			if err := cvd.AllReduce(b, []float32{2}, cvd.Sum); err != nil {
				t.Fatalf("other trainer's next call: %v", err)
			}
			if err := queued.Wait(); err != nil || x[0] != 3 || queued.Generation() == 0 {
				t.Fatalf("queued call: %v, got %v in generation %d, want 3 in a new generation", err, x[0], queued.Generation())
			}
		})
	}
}
