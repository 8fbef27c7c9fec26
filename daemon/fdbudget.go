package daemon

import (
	"os"
	"strconv"
	"strings"

	"github.com/collectived/collectived/ipc"
)

// fdsBesideClients is what a daemon holds open apart from its clients'
// connections and segments: the ring's links (their streams each way and
// the duplicates their readers poll), listeners, the netpoller, logs.
// Generous on purpose.
const fdsBesideClients = 64

// fdBudget is how many fds the daemon may need at once: a socket for each
// of max_clients connections; for each trainer, the duplicate its reader
// polls, its lane and max_segments segments; and the rest.
func (c Config) fdBudget() uint64 {
	return uint64(c.MaxClients) + uint64(c.LocalSize)*uint64(c.MaxSegments+2) + fdsBesideClients
}

// warnFDLimit logs, at start, a soft RLIMIT_NOFILE below fdBudget: the
// daemon then runs out of fds before its trainers reach their limits, and
// ALLOC, LANE, REGISTER and accepts fail (saying so) instead of QUOTA.
func (d *Daemon) warnFDLimit() {
	limit := ipc.FDLimit()
	if need := d.cfg.fdBudget(); limit != 0 && limit < need {
		d.log.Warn("the fd limit is below what the clients and their segments may take: raise LimitNOFILE or lower limits.max_segments or limits.max_clients",
			"rlimit_nofile", limit, "needed", need, "max_clients", d.cfg.MaxClients, "local_size", d.cfg.LocalSize, "max_segments", d.cfg.MaxSegments)
	}
}

// mappingsBesideSegments is what a daemon maps apart from its trainers'
// segments: its binary, the Go heap and stacks, the lanes. Generous.
const mappingsBesideSegments = 1024

// mapBudget is how many mappings the daemon may need at once: one per
// segment every trainer may hold, and the rest.
func (c Config) mapBudget() uint64 {
	return uint64(c.LocalSize)*uint64(c.MaxSegments) + mappingsBesideSegments
}

// warnMapLimit logs, at start, a vm.max_map_count (maxMapCountPath)
// below mapBudget: every segment is also a mapping, and past that count
// mmap fails (ALLOC and REGISTER then fail, saying so) before QUOTA.
func (d *Daemon) warnMapLimit(maxMapCountPath string) {
	b, err := os.ReadFile(maxMapCountPath)
	if err != nil {
		return
	}
	limit, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return
	}
	if need := d.cfg.mapBudget(); limit < need {
		d.log.Warn("vm.max_map_count is below what the trainers' segments may take: raise it (sysctl) or lower limits.max_segments",
			"max_map_count", limit, "needed", need, "local_size", d.cfg.LocalSize, "max_segments", d.cfg.MaxSegments)
	}
}
