// Command trainer is the e2e tests' trainer: a real client process that
// attaches to a daemon, runs a scripted sequence of collective calls, checks
// results against a reference it computes itself, and prints one JSON event
// per call on stdout.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

// event is one line of output.
type event struct {
	Call    int    `json:"call"`
	Rank    int    `json:"rank"`
	Desc    string `json:"desc"`
	Path    string `json:"path,omitempty"`
	OK      bool   `json:"ok"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
	Hash    string `json:"hash,omitempty"` // of the result bytes: equal on every rank
	Gen     uint32 `json:"gen"`
	Seq     uint64 `json:"seq"`
	Millis  int64  `json:"ms"`
}

func main() {
	socket := flag.String("socket", "", "daemon socket")
	job := flag.String("job", "e2e", "job name")
	mode := flag.String("mode", "sweep", "sweep | repeat")
	sizes := flag.String("sizes", "0,4,12,4096,65536,65540,1048588", "sweep: byte sizes")
	dtypes := flag.String("dtypes", "float32,float64,int32,int64", "sweep: dtypes")
	ops := flag.String("ops", "sum,prod,max,min", "sweep: reduce ops")
	paths := flag.String("paths", "inline,shm", "sweep: inline (plain memory) and/or shm (a daemon segment)")
	count := flag.Int("count", 1024, "repeat: float32 elements")
	times := flag.Int("times", 1, "repeat: calls")
	override := flag.String("count-for", "", "repeat: RANK[,RANK...]=COUNT makes those world ranks call another count")
	mismatchCall := flag.Int("mismatch-call", -1, "repeat: apply -count-for only to this call (-1: every call)")
	pause := flag.Duration("pause", 0, "repeat: sleep before each call")
	stopOnError := flag.Bool("stop-on-error", false, "repeat: exit after the first failed call")
	timeout := flag.Duration("timeout", 0, "client call timeout")
	connectFlood := flag.Int("connect-flood", 0, "connect this many times without a HELLO, read each until the daemon closes it, print how many it refused, and exit")
	flag.Parse()
	if *connectFlood > 0 {
		n, err := flood(*socket, *connectFlood)
		fmt.Println(n)
		if err != nil {
			fatal(err)
		}
		return
	}

	c, err := cvd.Dial(cvd.Options{Socket: *socket, Job: *job, LocalRank: -1, Label: "e2e-trainer", Timeout: *timeout})
	if err != nil {
		fatal(err)
	}
	defer c.Close()
	out := json.NewEncoder(os.Stdout)
	switch *mode {
	case "sweep":
		err = sweep(c, out, split(*sizes), split(*dtypes), split(*ops), split(*paths))
	case "repeat":
		err = repeat(c, out, *count, *times, *override, *mismatchCall, *pause, *stopOnError)
	default:
		err = fmt.Errorf("unknown mode %q", *mode)
	}
	if err != nil {
		fatal(err)
	}
}

// flood connects n times in turn and waits for the daemon to close each
// connection (a refused peer is answered with one ERROR frame); it
// returns how many were closed by the daemon.
func flood(socket string, n int) (int, error) {
	closed := 0
	buf := make([]byte, 8192)
	for range n {
		c, err := net.Dial("unix", socket)
		if err != nil {
			return closed, err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			if _, err := c.Read(buf); err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) {
					c.Close()
					return closed, fmt.Errorf("connection %d: the daemon kept it open: %w", closed, err)
				}
				break
			}
		}
		c.Close()
		closed++
	}
	return closed, nil
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "trainer:", err)
	os.Exit(1)
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// sweep runs every dtype x op x size x path and checks each result
// against an independent reference: the fold of every rank's input in
// world-rank order, computed here in float64 / int64 arithmetic.
func sweep(c *cvd.Client, out *json.Encoder, sizes, dtypes, ops, paths []string) error {
	n := 0
	for _, ds := range dtypes {
		dt, err := collective.ParseDType(ds)
		if err != nil {
			return err
		}
		for _, os_ := range ops {
			op, err := collective.ParseReduceOp(os_)
			if err != nil {
				return err
			}
			for _, ss := range sizes {
				size, err := strconv.Atoi(ss)
				if err != nil {
					return err
				}
				count := size / dt.Size()
				for _, path := range paths {
					buf, free, err := buffer(c, count*dt.Size(), path)
					if err != nil {
						return err
					}
					fillInput(buf, dt, op, c.Rank(), n)
					d := collective.Desc{Op: collective.OpAllReduce, DType: dt, Reduce: op, Count: uint64(count)}
					t0 := time.Now()
					h, err := c.Start(d, buf)
					if err == nil {
						err = h.Wait()
					}
					ev := event{Call: n, Rank: c.Rank(), Desc: d.String(), Path: path, Millis: time.Since(t0).Milliseconds()}
					if err != nil {
						free()
						return fmt.Errorf("call %d %s via %s: %w", n, d, path, err)
					}
					ev.Gen, ev.Seq = h.Generation(), h.Seq()
					if err := checkResult(buf, dt, op, c.Size(), n); err != nil {
						free()
						return fmt.Errorf("call %d %s via %s: %w", n, d, path, err)
					}
					sum := sha256.Sum256(buf)
					ev.OK, ev.Hash = true, hex.EncodeToString(sum[:8])
					free()
					out.Encode(ev)
					n++
				}
			}
		}
	}
	return nil
}

func buffer(c *cvd.Client, n int, path string) ([]byte, func(), error) {
	if path != "shm" || n == 0 {
		return make([]byte, n), func() {}, nil
	}
	s, err := c.Alloc(n)
	if err != nil {
		return nil, nil, err
	}
	return s.Bytes()[:n], func() { s.Free() }, nil
}

// input is world rank w's element i in call n. Values are chosen so the
// reference is exact: small integers, and for prod only ±1 and 2 so that
// products stay far from overflow and rounding.
func input(i, w, n int, op collective.ReduceOp) float64 {
	h := uint32(i*2654435761) ^ uint32(w*40503) ^ uint32(n*97)
	h ^= h >> 13
	if op == collective.Prod {
		return []float64{1, -1, 2, 1}[h%4]
	}
	return float64(int(h%201) - 100)
}

func fillInput(buf []byte, dt collective.DType, op collective.ReduceOp, w, n int) {
	es := dt.Size()
	for i := 0; i*es < len(buf); i++ {
		dt.Put(buf[i*es:], input(i, w, n, op))
	}
}

func checkResult(buf []byte, dt collective.DType, op collective.ReduceOp, world, n int) error {
	es := dt.Size()
	for i := 0; i*es < len(buf); i++ {
		want := input(i, 0, n, op)
		for w := 1; w < world; w++ {
			v := input(i, w, n, op)
			switch op {
			case collective.Sum:
				want += v
			case collective.Prod:
				want *= v
			case collective.Max:
				want = math.Max(want, v)
			case collective.Min:
				want = math.Min(want, v)
			}
		}
		if got := dt.Get(buf[i*es:]); got != want {
			return fmt.Errorf("element %d of %d: got %v, want %v", i, len(buf)/es, got, want)
		}
	}
	return nil
}

// repeat makes the same float32 sum call several times, reporting each
// outcome; -count-for makes one rank disagree.
func repeat(c *cvd.Client, out *json.Encoder, normal, times int, override string, mismatchCall int, pause time.Duration, stop bool) error {
	other := normal
	if override != "" {
		rs, cnt, ok := strings.Cut(override, "=")
		n, err := strconv.Atoi(cnt)
		if !ok || err != nil {
			return fmt.Errorf("-count-for %q: want RANK[,RANK...]=COUNT", override)
		}
		for _, r := range strings.Split(rs, ",") {
			rank, err := strconv.Atoi(r)
			if err != nil {
				return fmt.Errorf("-count-for %q: %q is not a rank", override, r)
			}
			if rank == c.Rank() {
				other = n
			}
		}
	}
	for k := 0; k < times; k++ {
		count := normal
		if mismatchCall < 0 || mismatchCall == k {
			count = other
		}
		x := make([]float32, count)
		time.Sleep(pause)
		for i := range x {
			x[i] = float32(c.Rank() + 1)
		}
		d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(count)}
		t0 := time.Now()
		h, err := cvd.AllReduceAsync(c, x, cvd.Sum)
		if err == nil {
			err = h.Wait()
		}
		ev := event{Call: k, Rank: c.Rank(), Desc: d.String(), Millis: time.Since(t0).Milliseconds()}
		if err != nil {
			ev.Message = err.Error()
			var e *ipc.Error
			if errors.As(err, &e) {
				ev.Code = e.Code.String()
			} else {
				ev.Code = "CLIENT"
			}
		} else {
			ev.OK, ev.Gen, ev.Seq = true, h.Generation(), h.Seq()
			want := float32(c.Size() * (c.Size() + 1) / 2)
			for i := range x {
				if x[i] != want {
					ev.OK, ev.Code, ev.Message = false, "WRONG", fmt.Sprintf("element %d: got %v, want %v", i, x[i], want)
					break
				}
			}
		}
		out.Encode(ev)
		if !ev.OK && stop {
			return nil
		}
	}
	return nil
}
