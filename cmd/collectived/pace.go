package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"
)

// Pacing lets `collectived bench --sidecar` run the daemons' world and
// the ring engines' world side by side, one block of calls at a time, so
// that both sides of the sidecar's cost see the same machine: on a shared
// machine, a run's speed drifts by tens of percent over seconds, far more
// than the cost being measured.
//
// The parent holds one end of a Unix socketpair per paced process (every
// trainer, every ring-only rank); the process has the other as fd 3.
//
//	parent -> process  'g'  run your next block
//	process -> parent  'd'  the block is over (its calls are answered)
//
// For each size a process waits for 'g' before its checked call and
// warmup (block 0) and before every --pace-block timed calls after them,
// and answers 'd' after each block; the final check of the results is
// inside the last block. Each timed block starts with one untimed call:
// the first call after the other world's turn runs cold. The parent lets
// one world run a block while the other waits, and alternates which goes
// first.
const (
	paceFD   = 3
	paceGo   = 'g'
	paceDone = 'd'
)

// paceFlags are the paced processes' flags; the parent sets them.
var paceFlags = []cli.Flag{
	&cli.IntFlag{Name: "pace-block", Usage: "timed calls per block, run when the parent says (fd 3); 0: not paced"},
	&cli.DurationFlag{Name: "pace-timeout", Value: 10 * time.Minute, Usage: "how long to wait for the parent's go-ahead"},
}

// pacer is a paced process's side of the protocol; a nil *pacer paces
// nothing.
type pacer struct {
	c       net.Conn
	block   int
	timeout time.Duration
	b       [1]byte
}

// pacerFromFlags opens the pacer the flags ask for, on fd 3; nil if
// --pace-block is 0.
func pacerFromFlags(c *cli.Context) (*pacer, error) {
	return openPacer(paceFD, c.Int("pace-block"), c.Duration("pace-timeout"))
}

func openPacer(fd uintptr, block int, timeout time.Duration) (*pacer, error) {
	switch {
	case block == 0:
		return nil, nil
	case block < 0:
		return nil, fmt.Errorf("--pace-block %d: want 0 (not paced) or more", block)
	case timeout <= 0:
		return nil, fmt.Errorf("--pace-timeout %v: want more than 0", timeout)
	}
	// Whatever fd is if not a socket is not ours to close.
	if _, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TYPE); err != nil {
		return nil, fmt.Errorf("--pace-block %d: fd %d is not the pacing socket: %w", block, fd, err)
	}
	f := os.NewFile(fd, "pace")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("--pace-block %d: fd %d is not the pacing socket: %w", block, fd, err)
	}
	return &pacer{c: c, block: block, timeout: timeout}, nil
}

// wait blocks until the parent says go.
func (p *pacer) wait() error {
	if p == nil {
		return nil
	}
	p.c.SetReadDeadline(time.Now().Add(p.timeout))
	if _, err := io.ReadFull(p.c, p.b[:]); err != nil {
		return fmt.Errorf("pacing: waiting for the go-ahead: %w", err)
	}
	if p.b[0] != paceGo {
		return fmt.Errorf("pacing: the parent sent %q, want %q", p.b[0], paceGo)
	}
	return nil
}

// done tells the parent the block is over.
func (p *pacer) done() error {
	if p == nil {
		return nil
	}
	p.c.SetWriteDeadline(time.Now().Add(p.timeout))
	p.b[0] = paceDone
	if _, err := p.c.Write(p.b[:]); err != nil {
		return fmt.Errorf("pacing: reporting a block done: %w", err)
	}
	return nil
}

// starts reports whether timed call i (from 0) begins a block, ends
// whether it is the last of one.
func (p *pacer) starts(i int) bool { return p != nil && i%p.block == 0 }
func (p *pacer) ends(i, iters int) bool {
	return p != nil && ((i+1)%p.block == 0 || i == iters-1)
}
