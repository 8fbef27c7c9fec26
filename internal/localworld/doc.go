// Package localworld starts a world of collectived daemons as processes
// on this machine, on 127.0.0.1, for the tools that measure a whole
// installation: `collectived bench` (and so `make demo`) and the soak
// benchmark. It writes the job's config, starts one `collectived run` per
// node, waits until every socket answers, reports a daemon that exits by
// itself, and stops them all by PID (SIGTERM, then SIGKILL after a grace).
//
// It is also the one place that chooses ports for daemons on this machine
// (FreePorts, Listeners): the e2e harness, the bench commands and the
// tests that need a port before its daemon binds it take theirs here. The
// ports lie outside the kernel's ephemeral range (ip_local_port_range),
// which outgoing connections draw their source ports from; a port taken
// from that range can be handed to a dialer before its daemon binds it.
package localworld
