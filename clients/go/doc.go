// Package collectived is the Go client of collectived: a trainer process
// attaches to its node's daemon over a Unix socket and makes collective calls
// (allreduce, broadcast, barrier) that span every trainer of the job.
//
//	c, err := collectived.Dial(collectived.Options{Job: "demo"})
//	if err != nil { ... }
//	defer c.Close()
//	grad := make([]float32, 1024)
//	err = collectived.AllReduce(c, grad, collectived.Sum) // every trainer now holds the sum
//
// Small buffers travel inside the request (up to [Options.InlineMax], 2 KiB
// by default, and never above the daemon's inline limit). For larger
// buffers, allocate them in shared memory with [Client.Alloc] or
// [AllocSlice]: calls on such memory move no bytes through the socket, the
// daemon reduces in place. Other buffers are copied through a scratch
// segment, which costs two copies: from a few kilobytes on, fewer than the
// socket's.
//
// Calls match by order across the world, as in MPI: the k-th call of every
// trainer joins collective k, and all must describe the same operation.
// Every call waits at most Options.Timeout; an error from the daemon is an
// [*Error] whose Code tells what happened (errors.Is(err, ErrMismatch), ...).
// By default ([DefaultTimeout]) a call waits the daemon's bound on any
// call, max(timeout_ms, first_call_timeout_ms) from its HELLO_OK, plus
// twice ipc.TimeoutMargin: long enough that the daemon's TIMEOUT, which
// names who has not called, arrives first, also for the first collective
// of a generation (a model still loading on some trainer).
//
// A call whose Desc.Named is set (protocol version 4) is matched by its
// Name instead of its place in the trainer's sequence of calls: the k-th
// named call of a name on every trainer meet, in whatever order each
// trainer makes its named calls (docs/MATCHING.md, "Named calls"). One
// name may be in flight only once per trainer: the client refuses a
// second call of a name whose earlier call has not been answered
// (BAD_REQUEST naming it), before sending anything.
//
// The client speaks protocol version 4 (docs/PROTOCOL.md): a call of up
// to ipc.PollMaxBytes made while no other is in flight goes to the daemon,
// and its answer comes back, through the connection's lane of shared
// memory rather than the socket (Options.NoLane keeps to the socket);
// named calls never take the lane. A daemon older than the client
// refuses its version with VERSION; Dial then asks again one version
// lower, on a new connection: in version 3 it has no named calls, in
// version 2 no first-call timeout either (the default wait is then twice
// timeout_ms plus two margins), in version 1 no lane either. It is safe for use by
// several goroutines; calls from several goroutines are ordered by when
// they reach the daemon.
package collectived
