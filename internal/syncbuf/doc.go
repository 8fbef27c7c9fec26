// Package syncbuf is a bytes.Buffer that several goroutines (a logger, a
// child process's output copier) may write while a test reads it. It is
// imported by tests only.
package syncbuf
