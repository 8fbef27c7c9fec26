package daemon

import "golang.org/x/sys/unix"

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
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &l) != nil {
		return
	}
	if need := d.cfg.fdBudget(); l.Cur < need {
		d.log.Warn("the fd limit is below what the clients and their segments may take: raise LimitNOFILE or lower limits.max_segments or limits.max_clients",
			"rlimit_nofile", l.Cur, "needed", need, "max_clients", d.cfg.MaxClients, "local_size", d.cfg.LocalSize, "max_segments", d.cfg.MaxSegments)
	}
}
