package e2e

import (
	"testing"
	"time"
)

// fleet is a set of running daemons as the resource checks see them:
// their sockets (asked for status as an observer) and their logs. Both
// harnesses have one: the loopback world and the namespaced cluster.
type fleet struct {
	t       *testing.T
	sockets []string
	log     func(node int) string
}

func (f fleet) status(i int) (nodeStatus, error) { return clusterStatus(f.sockets[i]) }

// waitUp waits until daemon i's ring is up in a generation >= minGen and
// returns its status.
func (f fleet) waitUp(i int, minGen uint32, d time.Duration) nodeStatus {
	f.t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, err := f.status(i)
		if err == nil && st.Ring.State == "up" && st.Ring.Generation >= minGen {
			return st
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("daemon %d: ring not up in generation >= %d within %v (status %+v, err %v); log:\n%s", i, minGen, d, st.Ring, err, f.log(i))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// procStatus is the daemon process's resource use (daemon.ProcessStatus).
type procStatus struct {
	PID        int   `json:"pid"`
	Goroutines int   `json:"goroutines"`
	FDs        int   `json:"fds"`
	Memfds     int   `json:"memfds"`
	RSSBytes   int64 `json:"rss_bytes"`
}

// rssSlack is how far a daemon's resident memory may stay above its
// baseline once a fault has healed. Go returns freed heap to the kernel
// lazily (the scavenger works in the background over minutes), and each
// ring generation allocates fresh receive buffers (segment_bytes per
// stream and link, 1 MiB by default) while the old ones await collection,
// so a few generations and 1 MiB calls leave tens of MiB resident that
// are not leaked. A leak of segments or buffers per call or per
// generation still shows: the fault tests make hundreds of MiB-sized
// calls.
const rssSlack = 64 << 20

// baseline is a daemon's resource use in a quiet moment: ring up, no
// trainer attached.
type baseline struct {
	node int
	ps   procStatus
	gen  uint32
}

// baselines waits for a stable reading of every daemon's resource use:
// two readings 200 ms apart with the same goroutines, fds and memfds
// (the observer's own connection is in both, and in every later one).
func (f fleet) baselines(nodes ...int) []baseline {
	f.t.Helper()
	if nodes == nil {
		for i := range f.sockets {
			nodes = append(nodes, i)
		}
	}
	var bs []baseline
	for _, i := range nodes {
		deadline := time.Now().Add(10 * time.Second)
		prev := f.waitUp(i, 0, 20*time.Second)
		for {
			time.Sleep(200 * time.Millisecond)
			st := f.waitUp(i, 0, 20*time.Second)
			a, b := prev.Process, st.Process
			if a.Goroutines == b.Goroutines && a.FDs == b.FDs && a.Memfds == b.Memfds {
				bs = append(bs, baseline{node: i, ps: b, gen: st.Ring.Generation})
				break
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("daemon %d: resource use never settled: %+v then %+v", i, a, b)
			}
			prev = st
		}
	}
	return bs
}

// checkBaselines waits (bounded) until every daemon in bs is back to its
// baseline: ring up, same goroutines, fds and memfds, RSS within
// rssSlack. It reports each daemon's readings.
func (f fleet) checkBaselines(bs []baseline, d time.Duration) {
	f.t.Helper()
	for _, b := range bs {
		deadline := time.Now().Add(d)
		var last procStatus
		var lastErr error
		for {
			st, err := f.status(b.node)
			lastErr = err
			if err == nil {
				last = st.Process
				if st.Ring.State == "up" && last.Goroutines == b.ps.Goroutines && last.FDs == b.ps.FDs &&
					last.Memfds == b.ps.Memfds && last.RSSBytes <= b.ps.RSSBytes+rssSlack {
					f.t.Logf("daemon %d back to baseline: goroutines %d, fds %d, memfds %d, rss %d MiB (baseline %d MiB), generation %d (was %d)",
						b.node, last.Goroutines, last.FDs, last.Memfds, last.RSSBytes>>20, b.ps.RSSBytes>>20, st.Ring.Generation, b.gen)
					break
				}
			}
			if time.Now().After(deadline) {
				f.t.Errorf("daemon %d not back to baseline within %v: now goroutines %d fds %d memfds %d rss %d MiB; baseline goroutines %d fds %d memfds %d rss %d MiB (+%d MiB slack); last status error %v",
					b.node, d, last.Goroutines, last.FDs, last.Memfds, last.RSSBytes>>20,
					b.ps.Goroutines, b.ps.FDs, b.ps.Memfds, b.ps.RSSBytes>>20, rssSlack>>20, lastErr)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
