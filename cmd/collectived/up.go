package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/collectived/collectived/internal/localworld"
)

// upCommand starts a development world on this machine and leaves it
// running: `collectived up --nodes N --local L`. It prints each node's
// socket and how to start trainers against it, and stops the daemons (by
// PID, through localworld) on Ctrl-C or SIGTERM.
func upCommand() *cli.Command {
	return &cli.Command{
		Name:  "up",
		Usage: "start a development world of daemons on this machine (127.0.0.1) and keep it running until Ctrl-C",
		Description: "Starts --nodes daemons on loopback, each serving --local trainers, with a job config and a\n" +
			"random token of their own, and prints every node's socket. Trainers attach with\n" +
			"COLLECTIVED_SOCKET=<node's socket> COLLECTIVED_JOB=<job> (and LOCAL_RANK, as torchrun sets it,\n" +
			"for collectived.torch). Ctrl-C (SIGINT) or SIGTERM stops the daemons and removes the directory\n" +
			"(unless --dir was given); a daemon that exits by itself stops the others and fails the command.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "nodes", Value: 2, Usage: "daemons (ring ranks)"},
			&cli.IntFlag{Name: "local", Value: 2, Usage: "trainers per node (job.local_size)"},
			&cli.StringFlag{Name: "job", Value: "dev", Usage: "the job `NAME` trainers give (COLLECTIVED_JOB)"},
			&cli.StringFlag{Name: "dir", Usage: "put the config, sockets and logs in `DIR` (kept afterwards; default: a new temporary directory, removed)"},
			&cli.StringFlag{Name: "config-extra", Usage: "`YAML` appended to the daemons' config (timeouts:, limits:, ...)"},
		},
		Action: func(c *cli.Context) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runUp(ctx, c.App.Writer, upOptions{
				nodes: c.Int("nodes"), local: c.Int("local"), job: c.String("job"),
				dir: c.String("dir"), extra: c.String("config-extra"),
			})
		},
	}
}

type upOptions struct {
	nodes, local int
	job, dir     string
	extra        string
	bin          string // the collectived binary; default this executable
}

// runUp starts the world, prints it, and waits until ctx is done (the
// signal) or a daemon exits by itself; then it stops every daemon.
func runUp(ctx context.Context, out io.Writer, o upOptions) error {
	if o.nodes < 1 || o.local < 1 || o.nodes*o.local > 1024 {
		return exitf("up: --nodes %d x --local %d: want at least 1 x 1 and at most 1024 trainers", o.nodes, o.local)
	}
	if o.job == "" {
		return exitf("up: --job is empty: want a name")
	}
	bin := o.bin
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return exitf("up: %v", err)
		}
		bin = self
	}
	dir, keep := o.dir, o.dir != ""
	if keep {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return exitf("up: --dir: %v", err)
		}
	} else {
		d, err := os.MkdirTemp("", "collectived-up-")
		if err != nil {
			return exitf("up: %v", err)
		}
		dir = d
		defer os.RemoveAll(dir)
	}
	w, err := localworld.Start(localworld.Options{Bin: bin, Dir: dir, Nodes: o.nodes, Local: o.local,
		Job: o.job, Extra: o.extra, StopGrace: 10 * time.Second})
	if err != nil {
		return exitf("up: %v", err)
	}
	defer w.Stop()
	fmt.Fprintf(out, "collectived up: %d nodes x %d trainers (world size %d), job %q, in %s\n",
		o.nodes, o.local, o.nodes*o.local, o.job, dir)
	for r, s := range w.Sockets {
		fmt.Fprintf(out, "node %d: socket %s  (pid %d, log %s; world ranks %d-%d)\n",
			r, s, w.PID(r), w.Logs[r], r*o.local, (r+1)*o.local-1)
	}
	fmt.Fprintf(out, "trainer of node N, local rank L (world rank N*%d+L):\n", o.local)
	fmt.Fprintf(out, "  COLLECTIVED_JOB=%s COLLECTIVED_SOCKET=%s LOCAL_RANK=0 python3 train.py\n", o.job, w.Sockets[0])
	fmt.Fprintf(out, "  (or per node: COLLECTIVED_JOB=%s COLLECTIVED_SOCKET=<its socket> torchrun --nproc_per_node %d train.py)\n", o.job, o.local)
	fmt.Fprintf(out, "status: collectived status --job %s --socket %s\n", o.job, w.Sockets[0])
	fmt.Fprintf(out, "ready; Ctrl-C stops the daemons\n")
	select {
	case <-ctx.Done():
		w.Stop()
		fmt.Fprintf(out, "collectived up: stopped %d daemons\n", o.nodes)
		return nil
	case r := <-w.Exited:
		err := w.Died(r)
		w.Stop()
		return exitf("up: %v", err)
	}
}
