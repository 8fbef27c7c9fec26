package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/daemon"
	"github.com/collectived/collectived/internal/logthrottle"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "ask a running daemon for its ring, trainers and what a collective waits for",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Usage: "the daemon's Unix socket `PATH` (default $COLLECTIVED_SOCKET, then " + cvd.DefaultSocket + ")"},
			&cli.StringFlag{Name: "job", Usage: "the job `NAME` (default $COLLECTIVED_JOB)"},
			&cli.BoolFlag{Name: "json", Usage: "print the daemon's JSON as it is"},
			&cli.DurationFlag{Name: "timeout", Value: 5 * time.Second, Usage: "give up after this long"},
		},
		Action: func(c *cli.Context) error {
			cl, err := cvd.Dial(cvd.Options{Socket: c.String("socket"), Job: c.String("job"), Observer: true,
				LocalRank: -1, Label: "collectived status", Timeout: c.Duration("timeout"), DialTimeout: c.Duration("timeout")})
			if err != nil {
				return err
			}
			defer cl.Close()
			raw, err := cl.StatusJSON()
			if err != nil {
				return err
			}
			if c.Bool("json") {
				var out bytes.Buffer
				json.Indent(&out, raw, "", "  ")
				out.WriteByte('\n')
				_, err := c.App.Writer.Write(out.Bytes())
				return err
			}
			var st daemon.Status
			if err := json.Unmarshal(raw, &st); err != nil {
				return fmt.Errorf("status: the daemon's answer is not the status this version knows: %w", err)
			}
			printStatus(c.App.Writer, &st)
			return nil
		},
	}
}

// printRefused prints one line of refusal counts, if any: the total, by
// reason, and the three sources refused most.
func printRefused(w io.Writer, where string, c logthrottle.Counts) {
	if c.Total == 0 {
		return
	}
	reasons := make([]string, 0, len(c.Reasons))
	for r := range c.Reasons {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool { return c.Reasons[reasons[i]] > c.Reasons[reasons[j]] })
	for i, r := range reasons {
		reasons[i] = fmt.Sprintf("%s %s", logthrottle.Thousands(c.Reasons[r]), r)
	}
	fmt.Fprintf(w, "refused on the %s: %s (%s)", where, logthrottle.Thousands(c.Total), strings.Join(reasons, ", "))
	for i, sc := range c.Sources {
		if i == 3 {
			break
		}
		sep := "; most from "
		if i > 0 {
			sep = ", "
		}
		fmt.Fprintf(w, "%s%s (%s %s, last %s)", sep, sc.Source, logthrottle.Thousands(sc.Count), sc.Reason, sc.Last.Format(time.RFC3339))
	}
	fmt.Fprintln(w)
}

func printStatus(w io.Writer, st *daemon.Status) {
	fmt.Fprintf(w, "job %q  node %d of %d  local size %d  socket %s\n", st.Job, st.NodeRank, st.NodeCount, st.LocalSize, st.Socket)
	fmt.Fprintf(w, "ring: %s, generation %d, %d collectives finished, listen %s", st.Ring.State, st.Ring.Generation, st.Ring.Finished, st.Listen)
	if st.Ring.Next != "" {
		fmt.Fprintf(w, ", next %s (heard %.1fs ago), prev %s (heard %.1fs ago)",
			st.Ring.Next, st.Ring.HeardFromNextSec, st.Ring.Prev, st.Ring.HeardFromPrevSec)
	}
	if st.Ring.Op != "" {
		fmt.Fprintf(w, "; in %s step %d", st.Ring.Op, st.Ring.Step)
	}
	fmt.Fprintln(w)
	p := st.Process
	fmt.Fprintf(w, "process: pid %d, %d goroutines, %d fds of %d (%d memfds), RSS %.1f MiB\n",
		p.PID, p.Goroutines, p.FDs, p.FDLimit, p.Memfds, float64(p.RSSBytes)/(1<<20))
	if st.Ring.LastError != "" {
		fmt.Fprintf(w, "last failure: %s\n", st.Ring.LastError)
	}
	fmt.Fprintln(w, "trainers:")
	for _, t := range st.Trainers {
		owes := ""
		if t.Owes > 0 {
			owes = fmt.Sprintf("; owes %d failed collectives (its next calls get their errors)", t.Owes)
		}
		if !t.Attached {
			fmt.Fprintf(w, "  local %d (world %d): not attached, %d calls made%s\n", t.LocalRank, t.WorldRank, t.Calls, owes)
			continue
		}
		lane := "socket only" // protocol version 1, or a client told not to (NoLane, no_lane)
		if t.Lane {
			lane = "small calls on its lane"
		}
		fmt.Fprintf(w, "  local %d (world %d): pid %d %q, %s, %d calls, %d queued, last %s%s\n",
			t.LocalRank, t.WorldRank, t.PID, t.Label, lane, t.Calls, t.Queued, t.LastCall, owes)
	}
	printRefused(w, "ring port", st.Refused.Ring)
	printRefused(w, "socket", st.Refused.Socket)
	if st.Truncated != "" {
		fmt.Fprintf(w, "(truncated: %s)\n", st.Truncated)
	}
	if f := st.InFlight; f != nil {
		fmt.Fprintf(w, "in flight: collective %d %s, %s for %.1fs", f.Seq, f.Call, f.Phase, f.WaitedSec)
		if f.NotCalled != "" {
			fmt.Fprintf(w, "; not called by %s", f.NotCalled)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "in flight: nothing")
	}
}
