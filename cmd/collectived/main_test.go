package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("4, 64KiB,1MiB,2G")
	if err != nil || len(got) != 4 || got[0] != 4 || got[1] != 64<<10 || got[2] != 1<<20 || got[3] != 2<<30 {
		t.Fatalf("parseSizes = %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "-1", "5GiB", "1.5MiB"} {
		if _, err := parseSizes(bad); err == nil || !strings.Contains(err.Error(), "--sizes") {
			t.Errorf("parseSizes(%q) = %v, want an error naming --sizes", bad, err)
		}
	}
}

// Bad bench flags are refused, by name, before any daemon starts.
func TestBenchRefusesBadFlags(t *testing.T) {
	for want, args := range map[string][]string{
		"--nodes 0 x --local 1":   {"--nodes", "0"},
		"at most 64 trainers":     {"--nodes", "9", "--local", "8"},
		"--sizes":                 {"--sizes", "4,lots"},
		"unknown dtype \"bf16\"":  {"--dtype", "bf16"},
		"unknown reduce op \"avg": {"--op", "avg"},
		"--iters 0":               {"--iters", "0"},
	} {
		app := newApp()
		app.ExitErrHandler = func(*cli.Context, error) {} // report, do not os.Exit
		var out bytes.Buffer
		app.Writer, app.ErrWriter = &out, &out
		err := app.Run(append([]string{"collectived", "bench"}, args...))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bench %v: %v, want an error saying %q", args, err, want)
		}
	}
}

func TestVersion(t *testing.T) {
	app := newApp()
	var out bytes.Buffer
	app.Writer = &out
	if err := app.Run([]string{"collectived", "version"}); err != nil || !strings.Contains(out.String(), "client protocol 1") {
		t.Fatalf("version: %v %q", err, out.String())
	}
}
