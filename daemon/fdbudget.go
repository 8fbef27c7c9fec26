package daemon

import "golang.org/x/sys/unix"

// fdsBesideSegments is what a daemon holds open apart from its trainers'
// segments: per trainer its socket, the duplicate its reader polls and its
// lane; the ring's links (2 streams each way, plus the duplex stream's
// duplicates), listeners, the netpoller, logs. Generous on purpose.
const fdsBesideSegments = 128

// fdBudget is how many fds the daemon may need at once: every trainer
// holding limits.max_segments segments, and the rest.
func (c Config) fdBudget() uint64 {
	return uint64(c.LocalSize)*uint64(c.MaxSegments+3) + fdsBesideSegments
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
		d.log.Warn("the fd limit is below what the trainers may hold: raise LimitNOFILE or lower limits.max_segments",
			"rlimit_nofile", l.Cur, "needed", need, "local_size", d.cfg.LocalSize, "max_segments", d.cfg.MaxSegments)
	}
}
