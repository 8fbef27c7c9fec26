package parked

import (
	"testing"
	"time"
)

// What a poller's turn pays for Poll: with nobody asleep (a load), within
// pollEvery of the last look (two loads), and a look at four sleepers
// with nothing to read (a poll(2) each time; at most every pollEvery in
// the daemon).
func BenchmarkPoll(b *testing.B) {
	b.Run("nobody_asleep", func(b *testing.B) {
		now := time.Now().UnixNano()
		for b.Loop() {
			Poll(now)
		}
	})
	sleepers := func(b *testing.B, n int) {
		b.Helper()
		for range n {
			a, _ := socketPair(b)
			r := newCounted(a)
			r.Sleep()
			b.Cleanup(r.Awake)
		}
	}
	b.Run("rate_limited", func(b *testing.B) {
		sleepers(b, 4)
		now := time.Now().UnixNano()
		Poll(now)
		for b.Loop() {
			Poll(now)
		}
	})
	b.Run("look_at_4", func(b *testing.B) {
		sleepers(b, 4)
		for b.Loop() {
			pollNow()
		}
	})
}
