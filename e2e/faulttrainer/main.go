// Command faulttrainer is the fault tests' trainer: a real client process
// that loops on float32 sum allreduces through a fault and past it, or
// holds shared segments until it is killed. Unlike e2e/trainer it prints
// each call as it ends, with wall-clock times, so a test can tell when
// every trainer learnt of a fault, and it keeps calling after a failure so
// the same processes show that the re-formed ring serves them.
//
// Output: one JSON object per line on stdout (see event).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/ipc"
)

// event is one finished call, or (Held > 0) the report that segments are
// held. Times are Unix nanoseconds.
type event struct {
	Call    int    `json:"call"`
	Rank    int    `json:"rank"`
	OK      bool   `json:"ok"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	Gen     uint32 `json:"gen"`
	Seq     uint64 `json:"seq"`
	StartNs int64  `json:"start_ns"`
	EndNs   int64  `json:"end_ns"`
	Held    int    `json:"held,omitempty"`
}

func main() {
	socket := flag.String("socket", "", "daemon socket")
	job := flag.String("job", "e2e", "job name")
	mode := flag.String("mode", "loop", "loop | hold")
	count := flag.Int("count", 1024, "float32 elements per call")
	path := flag.String("path", "inline", "loop: inline (plain memory) or shm (a daemon segment)")
	untilOK := flag.Int("until-ok", 0, "loop: exit once this many calls in a row succeeded (0: no such limit)")
	needFail := flag.Bool("need-fail", false, "loop: -until-ok counts only after a failed call")
	maxFails := flag.Int("max-fails", 10, "loop: exit after this many failed calls")
	stopFile := flag.String("stop-file", "", "loop: once this file exists and holds a call number K, exit before call K")
	deadline := flag.Duration("deadline", 2*time.Minute, "exit (status 3) if still running after this long")
	timeout := flag.Duration("timeout", 0, "client call timeout (0: the client's default)")
	segments := flag.Int("segments", 3, "hold: segments to allocate")
	segBytes := flag.Int("segment-bytes", 1<<20, "hold: bytes per segment")
	holdCalls := flag.Int("hold-calls", 1, "hold: allreduces to make on the first segment before holding")
	flag.Parse()

	// Never outlive a test that forgot us.
	time.AfterFunc(*deadline, func() {
		fmt.Fprintf(os.Stderr, "faulttrainer: deadline %v passed\n", *deadline)
		os.Exit(3)
	})
	var stop atomic.Bool
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() { <-sigs; stop.Store(true) }()

	c, err := cvd.Dial(cvd.Options{Socket: *socket, Job: *job, LocalRank: -1, Label: "e2e-faulttrainer", Timeout: *timeout})
	if err != nil {
		fatal(err)
	}
	defer c.Close()
	out := json.NewEncoder(os.Stdout) // unbuffered: each line is written as the call ends
	switch *mode {
	case "loop":
		err = loop(c, out, *count, *path, *untilOK, *needFail, *maxFails, *stopFile, &stop)
	case "hold":
		err = hold(c, out, *count, *segments, *segBytes, *holdCalls)
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "faulttrainer:", err)
	os.Exit(1)
}

// loop calls until stopped: by SIGTERM (after the call in progress), by
// the stop file, after untilOK successes in a row (following a failure if
// needFail), or after maxFails failures. Trainers of one world are in
// step (none can start call k+1 before all made call k), so a stop file
// naming a call a few ahead of the latest stops them all at the same call.
func loop(c *cvd.Client, out *json.Encoder, count int, path string, untilOK int, needFail bool, maxFails int, stopFile string, stop *atomic.Bool) error {
	x, err := buffer(c, count, path)
	if err != nil {
		return err
	}
	failed, okRun := 0, 0
	for k := 0; !stop.Load(); k++ {
		if stopFile != "" {
			if b, err := os.ReadFile(stopFile); err == nil {
				if at, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && k >= at {
					return nil
				}
			}
		}
		ev := call(c, x, k)
		out.Encode(ev)
		if !ev.OK {
			failed++
			okRun = 0
			if failed >= maxFails {
				return nil
			}
			continue
		}
		okRun++
		if untilOK > 0 && okRun >= untilOK && (failed > 0 || !needFail) {
			return nil
		}
	}
	return nil
}

func buffer(c *cvd.Client, count int, path string) ([]float32, error) {
	switch path {
	case "inline":
		return make([]float32, count), nil
	case "shm":
		x, _, err := cvd.AllocSlice[float32](c, count)
		return x, err
	}
	return nil, fmt.Errorf("unknown path %q", path)
}

// call makes call k on x and checks the sum exactly: every element ends as
// the sum of 1..world size.
func call(c *cvd.Client, x []float32, k int) event {
	for i := range x {
		x[i] = float32(c.Rank() + 1)
	}
	ev := event{Call: k, Rank: c.Rank(), StartNs: time.Now().UnixNano()}
	h, err := cvd.AllReduceAsync(c, x, cvd.Sum)
	if err == nil {
		err = h.Wait()
	}
	ev.EndNs = time.Now().UnixNano()
	if err != nil {
		ev.Message = err.Error()
		var e *ipc.Error
		if errors.As(err, &e) {
			ev.Code = e.Code.String()
		} else {
			ev.Code = "CLIENT"
		}
		return ev
	}
	ev.OK, ev.Gen, ev.Seq = true, h.Generation(), h.Seq()
	want := float32(c.Size() * (c.Size() + 1) / 2)
	for i := range x {
		if x[i] != want {
			ev.OK, ev.Code, ev.Message = false, "WRONG", fmt.Sprintf("element %d: got %v, want %v", i, x[i], want)
			break
		}
	}
	return ev
}

// hold allocates segments, uses the first for calls, reports them held,
// and sleeps until killed (bounded by the deadline).
func hold(c *cvd.Client, out *json.Encoder, count, segments, segBytes, calls int) error {
	if count*4 > segBytes {
		return fmt.Errorf("hold: %d float32 elements do not fit a %d-byte segment", count, segBytes)
	}
	var segs []*cvd.Segment
	for i := 0; i < segments; i++ {
		s, err := c.Alloc(segBytes)
		if err != nil {
			return err
		}
		clear(s.Bytes()) // touch every page
		segs = append(segs, s)
	}
	x := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(segs[0].Bytes()))), count)
	for k := 0; k < calls; k++ {
		ev := call(c, x, k)
		out.Encode(ev)
		if !ev.OK {
			return fmt.Errorf("hold: call %d failed: %s %s", k, ev.Code, ev.Message)
		}
	}
	out.Encode(event{Rank: c.Rank(), OK: true, Held: len(segs), EndNs: time.Now().UnixNano()})
	time.Sleep(24 * time.Hour) // the deadline ends us first
	return nil
}
