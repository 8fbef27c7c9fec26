package daemon

import (
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/collectived/collectived/ipc"
)

// ProcessStatus is the daemon process's own resource use, so that tests and
// operators can see leaks: it should return to its baseline after clients
// leave and faults heal.
type ProcessStatus struct {
	PID        int `json:"pid"`
	Goroutines int `json:"goroutines"`
	FDs        int `json:"fds"`
	Memfds     int `json:"memfds"` // open fds that are shared-memory segments
	// FDLimit is the soft RLIMIT_NOFILE: a daemon at it fails ALLOC, LANE
	// and REGISTER (saying so) and accepts no connection until fds free.
	FDLimit  uint64 `json:"fd_limit"`
	RSSBytes int64  `json:"rss_bytes"`
	// Mallocs is the Go runtime's count of heap allocations so far: its
	// growth per collective in the steady state should be zero.
	Mallocs uint64 `json:"mallocs"`
	// HeapBytes is the Go heap in use (excluding shared segments).
	HeapBytes uint64 `json:"heap_bytes"`
}

func processStatus() ProcessStatus {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	ps := ProcessStatus{PID: os.Getpid(), Goroutines: runtime.NumGoroutine(), Mallocs: ms.Mallocs, HeapBytes: ms.HeapAlloc}
	ps.FDLimit = ipc.FDLimit()
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		ps.FDs = len(ents)
		for _, e := range ents {
			if t, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(t, "/memfd:") {
				ps.Memfds++
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				ps.RSSBytes = pages * int64(os.Getpagesize())
			}
		}
	}
	return ps
}
