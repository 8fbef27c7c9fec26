package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/internal/localworld"
)

// A small call runs on the hot lane, except right after a collective
// that was not a small allreduce: then it runs on the engine, and the
// small call after it on the hot lane again. Two daemons in this process
// on loopback, one trainer each; each pause lets the engine go idle, so
// that the hot lane is open to the next call but for the rule.
func TestNoHotLaneRightAfterALargeCall(t *testing.T) {
	dir, err := os.MkdirTemp("", "cvd-hot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ports, err := localworld.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	peers := []string{fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])}
	var ds []*Daemon
	var clients []*cvd.Client
	for rank := range 2 {
		cfg := DefaultConfig()
		cfg.Job = "hot"
		cfg.Token = []byte("0123456789abcdef0123")
		cfg.Peers, cfg.Rank, cfg.LocalSize = peers, rank, 1
		cfg.SocketPath = filepath.Join(dir, fmt.Sprintf("d%d.sock", rank))
		cfg.Spin = 200 * time.Microsecond
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		d.Start()
		t.Cleanup(func() { d.Close() })
		ds = append(ds, d)
	}
	for rank, d := range ds {
		c, err := cvd.Dial(cvd.Options{Socket: d.cfg.SocketPath, Job: "hot", LocalRank: 0})
		if err != nil {
			t.Fatalf("trainer of node %d: %v", rank, err)
		}
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	call := func(what string, n int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, len(clients))
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				x := make([]float32, n)
				for k := range x {
					x[k] = float32(i + 1)
				}
				if errs[i] = cvd.AllReduce(c, x, cvd.Sum); errs[i] == nil && x[n-1] != 3 {
					t.Errorf("%s: node %d got %v, want 3", what, i, x[n-1])
				}
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s: node %d: %v", what, i, err)
			}
		}
		time.Sleep(50 * time.Millisecond) // the engines go idle
	}
	hot := func() uint64 {
		ds[0].mu.Lock()
		defer ds[0].mu.Unlock()
		return ds[0].hotRuns
	}
	for range 5 {
		call("small", 1)
	}
	if hot() == 0 {
		t.Fatal("no small call took the hot lane")
	}
	call("large", 256<<10/4)
	before := hot()
	call("small right after the large one", 1)
	if got := hot(); got != before {
		t.Fatalf("the small call right after a large one ran on the hot lane (%d runs, were %d)", got, before)
	}
	call("small after a small one", 1)
	if got := hot(); got != before+1 {
		t.Fatalf("the second small call after a large one: %d hot lane runs, want %d", got, before+1)
	}
}
