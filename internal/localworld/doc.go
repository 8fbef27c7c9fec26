// Package localworld starts a world of collectived daemons as processes
// on this machine, on 127.0.0.1, for the tools that measure a whole
// installation: `collectived bench` (and so `make demo`) and the soak
// benchmark. It writes the job's config, starts one `collectived run` per
// node, waits until every socket answers, reports a daemon that exits by
// itself, and stops them all by PID (SIGTERM, then SIGKILL after a grace).
package localworld
