// Package e2e holds the end-to-end tests of collectived: they build the real
// daemon binary and a trainer program (e2e/trainer), start daemons as
// processes on loopback and trainers as processes attached to them, and
// check results, errors and recovery from the outside, as a user would.
// Processes are stopped by their PID.
package e2e
