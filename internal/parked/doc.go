// Package parked keeps the set of this process's readers asleep in Go's
// netpoller, so that goroutines busy polling can wake the ones whose data
// has come.
//
// Why: the scheduler looks at the netpoller only when a P finds both run
// queues empty (or sysmon, every 10 ms). A goroutine that polls a socket
// or a shared-memory lane and calls runtime.Gosched between polls sits on
// the global run queue, so while any poller runs, a reader parked in the
// netpoller stays asleep after its data has come: on a two-CPU machine
// with four polling processes, 100-350 µs (docs/TUNING.md, sections 11
// and 26). This is what a call of one size after a call of another paid:
// the long call left some readers parked, and the pollers of the next
// call kept them there.
//
// A reader that stops polling and parks says so (Reader.Sleep) and takes
// itself off the set when its read returns (Reader.Awake). Pollers call
// Poll between polls: at most every pollEvery it asks poll(2), without
// waiting, which sleeping readers' fds are readable, and runs those
// readers' wake functions. A wake function ends the parked read at once
// (a read deadline in the past, on an fd whose RawConn does not allocate
// for it); the reader takes that as "poll again", not as an error.
package parked
