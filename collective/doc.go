// Package collective owns the description of one collective call: which
// operation, element type, reduce operation, element count, root and name.
//
// It is the one place these are declared. The ring engine puts a
// description's fingerprint in every frame it sends, the Unix-socket
// protocol carries descriptions from trainers, and the daemon compares
// them across trainers; all three use the types and numeric codes here,
// which are also the codes on the wire (docs/PROTOCOL.md).
//
// The package has no dependencies beyond the standard library and knows
// nothing of sockets, rings or clients.
package collective
