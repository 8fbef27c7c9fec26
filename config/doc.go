// Package config owns collectived's configuration: the Config type, its
// defaults, reading it from one YAML file, validating it, and the few
// operations that interpret it on a node: resolving this node's rank,
// reading the job token, and the digest of the settings all nodes must
// share.
//
// Reading is strict. The file is decoded into a yaml.Node tree and walked
// against a fixed schema, so an unknown or repeated key, a value of the
// wrong type, a second YAML document or any out-of-range value is an
// error naming the key and its line:
//
//	config.yaml:14: timeouts.collective: "5x" is not a duration (e.g. "500ms", "10s", "5m", "1h")
//
// Parse and Validate report every problem at once as an ErrorList of
// *Error; each matches ErrInvalid with errors.Is.
//
// Values: sizes are integers (bytes) or strings with a unit ("64KiB",
// "1MiB", "4GiB"; "KB", "MB" are decimal); durations are Go duration
// strings ("10s", "5m"); socket.mode is octal text ("0660"). YAML's loose
// typing is not trusted: a string key given yes, no or 010 unquoted is
// refused rather than read as a boolean or a number.
//
// Rank auto and loopback: a peer list may be all loopback (every daemon on
// one machine, for tests) or all routable, never a mix, since a node would
// dial its own loopback for a remote peer. On an all-loopback list every
// peer is local, so rank auto is ambiguous there by design: each daemon
// gets its rank from the file or the override passed to ResolveRank.
//
// Parse and Validate are pure: they touch neither the file system nor the
// network, so a config can be checked anywhere. Token reads the token file
// or variable, and ResolveRank lists the interfaces (and, for host names,
// asks the resolver); call them on the node that will run.
//
// The package knows nothing of sockets, rings or clients; it only
// describes them.
package config
