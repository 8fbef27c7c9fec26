// Command soak is the soak benchmark of issue 6: it starts a world of
// collectived daemons on loopback (nodes x local trainers), makes a million
// small allreduces through them and watches each daemon's resource use
// (RSS, open fds, goroutines, Go heap, allocations) while they run. After a
// warm-up it fits a least-squares line of each metric against the number
// of collectives done and reports the slope per 100,000 calls: a daemon
// that leaks shows a slope, a healthy one is flat.
//
//	go run ./bench/soak                        # 1,000,000 calls, 2 x 2, 4 B
//	go run ./bench/soak --calls 20000 --sample 500ms
//	go run ./bench/soak --json > soak.json
//
// The daemons are the processes under test: they are built from
// ./cmd/collectived (or taken from --bin), run as processes of their own
// and stopped by PID at the end, whatever happens (SIGTERM, then SIGKILL
// after a bound). The trainers are goroutines of this program using the Go
// client; every --check-every calls each checks the exact expected sum.
// Status is read through one observer connection per daemon, kept open for
// the whole run so that it adds a constant, not a trend.
//
// It is a benchmark, not a test: it exits non-zero only when a result is
// wrong, a call fails or a daemon dies, never because a slope is not zero;
// the report says which metrics are flat. See bench/README.md and
// docs/SOAK.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// options are the command's flags.
type options struct {
	Calls      int           `json:"calls"`
	Nodes      int           `json:"nodes"`
	Local      int           `json:"local"`
	Size       int           `json:"size_bytes"`
	Sample     time.Duration `json:"-"`
	SampleSec  float64       `json:"sample_sec"`
	Warmup     float64       `json:"warmup_fraction"`
	CheckEvery int           `json:"check_every"`
	Spin       time.Duration `json:"-"`
	Bin        string        `json:"bin,omitempty"`
	JSON       bool          `json:"-"`
	Settle     time.Duration `json:"-"`
	SettleSec  float64       `json:"settle_sec"`
	From       string        `json:"-"`
	// DialTimeout is the Go client's Options.DialTimeout. The soak found
	// that the client used to keep HELLO's write deadline on its socket
	// (every write DialTimeout after dialing failed); a run of more than
	// 10 s at the default checks that it no longer does.
	DialTimeout    time.Duration `json:"-"`
	DialTimeoutSec float64       `json:"dial_timeout_sec"`
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.IntVar(&o.Calls, "calls", 1000000, "allreduces each trainer makes (= collectives completed)")
	fs.IntVar(&o.Nodes, "nodes", 2, "daemons (nodes) on loopback")
	fs.IntVar(&o.Local, "local", 2, "trainers per node")
	fs.IntVar(&o.Size, "size", 4, "bytes per allreduce (float32 elements, a multiple of 4)")
	fs.DurationVar(&o.Sample, "sample", 5*time.Second, "how often to read each daemon's status")
	fs.Float64Var(&o.Warmup, "warmup", 0.1, "fraction of the calls left out of the fit")
	fs.IntVar(&o.CheckEvery, "check-every", 10000, "each trainer checks the exact sum every this many calls (and the last)")
	fs.DurationVar(&o.Spin, "spin", 0, "client poll time before sleeping (0: the client's default; negative: never poll)")
	fs.StringVar(&o.Bin, "bin", "", "collectived binary to test (default: go build ./cmd/collectived into a temp dir)")
	fs.BoolVar(&o.JSON, "json", false, "print the result as JSON on stdout (progress still goes to stderr)")
	fs.DurationVar(&o.Settle, "settle", 2*time.Second, "after the trainers detach, wait this long and sample once more")
	fs.DurationVar(&o.DialTimeout, "dial-timeout", 10*time.Second, "the Go client's DialTimeout for trainers and observers")
	fs.StringVar(&o.From, "from", "", "run nothing: print the report of a result saved with --json")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("soak: unexpected argument %q", fs.Arg(0))
	}
	switch {
	case o.Calls < 1:
		return o, fmt.Errorf("soak: --calls %d: want at least 1", o.Calls)
	case o.Nodes < 1 || o.Nodes > 64:
		return o, fmt.Errorf("soak: --nodes %d: want 1 to 64", o.Nodes)
	case o.Local < 1 || o.Local > 64:
		return o, fmt.Errorf("soak: --local %d: want 1 to 64", o.Local)
	case o.Nodes*o.Local > 256:
		// The check values must stay exact float32 integers (< 2^24).
		return o, fmt.Errorf("soak: --nodes %d x --local %d = %d trainers: want at most 256", o.Nodes, o.Local, o.Nodes*o.Local)
	case o.Size < 4 || o.Size%4 != 0:
		return o, fmt.Errorf("soak: --size %d: want a positive multiple of 4 bytes", o.Size)
	case o.Sample < 10*time.Millisecond:
		return o, fmt.Errorf("soak: --sample %v: want at least 10ms", o.Sample)
	case o.Warmup < 0 || o.Warmup >= 1:
		return o, fmt.Errorf("soak: --warmup %v: want a fraction in [0, 1)", o.Warmup)
	case o.CheckEvery < 1:
		return o, fmt.Errorf("soak: --check-every %d: want at least 1", o.CheckEvery)
	case o.DialTimeout <= 0:
		return o, fmt.Errorf("soak: --dial-timeout %v: want more than 0", o.DialTimeout)
	case o.Settle < 0:
		return o, fmt.Errorf("soak: --settle %v: want 0 or more", o.Settle)
	}
	if o.Bin != "" {
		abs, err := filepath.Abs(o.Bin)
		if err != nil {
			return o, fmt.Errorf("soak: --bin %s: %w", o.Bin, err)
		}
		if _, err := os.Stat(abs); err != nil {
			return o, fmt.Errorf("soak: --bin: %w", err)
		}
		o.Bin = abs
	}
	o.SampleSec, o.SettleSec, o.DialTimeoutSec = o.Sample.Seconds(), o.Settle.Seconds(), o.DialTimeout.Seconds()
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if o.From != "" {
		os.Exit(reprint(o.From))
	}
	os.Exit(run(o))
}

// reprint prints the report of a saved --json result.
func reprint(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: --from:", err)
		return 2
	}
	var res result
	if err := json.Unmarshal(b, &res); err != nil {
		fmt.Fprintf(os.Stderr, "soak: --from %s: not a soak --json result: %v\n", path, err)
		return 2
	}
	if len(res.Daemons) == 0 || res.Options.Calls == 0 {
		fmt.Fprintf(os.Stderr, "soak: --from %s: not a soak --json result (no options or daemons)\n", path)
		return 2
	}
	res.Options.Sample = time.Duration(res.Options.SampleSec * float64(time.Second))
	res.Options.Settle = time.Duration(res.Options.SettleSec * float64(time.Second))
	printReport(os.Stdout, &res)
	if res.Error != "" {
		return 1
	}
	return 0
}

// run does the soak and returns the exit code; everything it starts is
// stopped before it returns.
func run(o options) int {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	res, err := soak(ctx, o)
	if res != nil {
		if o.JSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			if jerr := enc.Encode(res); jerr != nil {
				fmt.Fprintln(os.Stderr, "soak: json:", jerr)
			}
		} else {
			printReport(os.Stdout, res)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: FAIL:", err)
		return 1
	}
	return 0
}
