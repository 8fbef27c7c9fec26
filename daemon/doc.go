// Package daemon is the core of collectived: it matches the calls of the
// trainers attached to this node, reduces their buffers locally, drives the
// ring engine across nodes, and replies.
//
// # Matching
//
// Each of the node's local_size trainers owns a slot. A trainer's calls queue
// in its slot in the order they arrive; the k-th call of every slot forms
// local collective k. The engine waits until every slot has a call at its
// head, checks that all descriptions agree, and only then touches data. The
// ring engine checks the same across nodes through the fingerprints in its
// frames, so the k-th call of every trainer in the world joins collective k.
//
// # Reduction order
//
// Allreduce folds the local buffers in local-rank order into local rank 0's
// buffer (((b0 op b1) op b2) ...), runs the ring allreduce on that buffer
// (whose order ring/doc.go documents), and copies the result into the other
// local trainers' buffers; the ring does the fold and the copies a segment
// at a time as it goes (Ring.AllReduceLocal), which changes no arithmetic.
// The order depends only on the world, so every trainer gets bit-identical
// results, run after run.
//
// # The hot lane
//
// On a node with one trainer, a small allreduce runs on the trainer's
// session goroutine itself, from the request to the answer, when the
// engine is idle; the engine keeps the numbering and every failure path
// (hotlane.go).
//
// # Generations
//
// docs/MATCHING.md states the rules and match.go implements them (a pure
// type, checked by the model test). In short: a trainer's k-th call is
// its call of collective k; a failure (a peer lost, a timeout, a
// mismatch, a trainer lost mid-collective) fails collective k on every
// trainer, at once for those that made it and as a debt paid by the next
// call of those that had not; calls queued behind it go on in the next
// generation, whose collectives the ring numbers from 0 again. Every
// generation starts with the nodes agreeing on how many collectives the
// world has finished, so a node that missed a failure owes it too.
//
// # Failure kinds across nodes
//
// A failure the core detects itself (a local mismatch, a lost trainer, a
// local timeout, a shutdown) wraps the ring's sentinel for its kind
// (ring.ErrMismatch, ErrCallerLost, ErrTimeout, ErrShutdown) and aborts
// the ring with it; the abort frame carries the kind as a code, and every
// node picks the trainers' error code with errors.Is. Ring ranks in a
// message are followed by a legend naming each one's node, address and
// world ranks, read from the ring error's fields, and by the node at
// fault when the ring knows it (ring.Error.Culprit).
package daemon
