// Package logthrottle rate-limits repeated log lines by kind and source,
// and counts what it suppresses. The daemon logs every refused connection
// through one (the ring port's and the Unix socket's), so that a stranger
// flooding either cannot grow the log without bound, nor push an
// operator's real errors past journald's own rate limit.
//
// Per kind (the reason for a refusal) and source (an IP address, a uid),
// the first Burst events of a quiet spell are logged in full, as they
// come. Further events of the same key are only counted, and one summary
// line per Window says how many there were:
//
//	rendezvous: 1,234 connections refused from 10.0.0.9 in the last 10s: bad magic
//
// A key keeps summarising while its events go on, and is forgotten after a
// Window without any: its next event is logged in full again. At most
// MaxSources keys are tracked at once; events from further sources are
// counted together under the source "other sources". So a flood costs,
// per key, Burst lines and then one line per Window, and all keys
// together at most MaxSources+1 times that, whatever its rate.
//
// Totals by kind, and by kind and source for the first MaxSources keys
// seen, are kept from the start for `collectived status` (Snapshot).
package logthrottle
