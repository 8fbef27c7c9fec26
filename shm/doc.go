// Package shm owns shared-memory segments: memfds that the daemon creates
// or imports from clients, sealed so that nobody can shrink them under a
// mapping, mapped read-write and shared, and a per-client Table that holds
// them under a quota with reference counts for calls in flight.
//
// A sealed memfd is what makes shared memory safe for the daemon: without
// F_SEAL_SHRINK a client could truncate the file and make the daemon's next
// access to the mapping fault (SIGBUS). Create seals what it makes; Import
// refuses anything that is not a memfd sealed against shrinking, or whose
// size differs from what the client claims.
//
// The package knows nothing of the protocol that carries the fds.
package shm
