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
// A ring failure (a peer lost, a timeout, a mismatch, a trainer lost
// mid-collective) fails the collective in flight and every call queued
// behind it with the original cause. The daemon then re-forms the ring as a
// new generation, whose collectives are numbered from 0 again; trainers stay
// attached throughout and their next call joins the new generation.
//
// Every trainer fails exactly its call of the failed collective k: calls
// already made fail at once; a trainer attached at the failure that had
// not yet made its k-th call owes one failure, which its next call
// receives instead of joining the new generation; so does a slot still
// empty (a trainer may attach late) when the collective had begun
// somewhere, which the failure's cause tells. A debt owed by an attached
// trainer leaves with it: its replacement starts afresh.
// Without this a late call of collective k would meet other trainers'
// calls of k+1 in the new generation — a mismatch at best, silently wrong
// training at worst. The exception is a failure caused by a lost trainer:
// the job then restarts trainers, so the lost trainer's slot and slots
// left empty start afresh (attached trainers that had not called still
// owe their call).
//
// # Failure messages across nodes
//
// A failure that the core detects itself (a local mismatch, a lost trainer,
// a local timeout) aborts the ring with a reason that starts with a tag in
// brackets, e.g. "[mismatch] ...". The ring carries the reason to every node,
// where the tag selects the error code the trainers see; the message they
// read has the tags removed. The tag is a convention between daemons of one
// version; ring/ does not interpret it. Ring ranks in a message are
// followed by a legend naming each one's node, address and world ranks,
// and by the node at fault when the ring knows it (ring.Error.Culprit).
package daemon
