// Package fdtest fills a test process's file descriptor table, so that
// tests can reach the paths a daemon takes when an open, dup or accept
// fails with EMFILE. It is imported by tests only.
package fdtest
