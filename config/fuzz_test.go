package config

import (
	"errors"
	"log/slog"
	"os"
	"testing"
)

// FuzzParse checks that no input makes Parse panic, and that its answer is
// always either a valid config or a list of errors each naming its line.
// The seeds run in every normal `go test`.
func FuzzParse(f *testing.F) {
	if example, err := os.ReadFile("../config.yaml"); err == nil {
		f.Add(example)
	}
	for _, s := range []string{
		base,
		base + "rank: auto\nlisten: 0.0.0.0:7000\n",
		base + "timeouts:\n  collective: 5x\n",
		base + "---\nrank: 1\n",
		base + "ring:\n  segment_bytes: \"64 KiB\"\n  small_bytes: 0x10\n",
		base + "socket:\n  mode: 0o4777\n  allowed_uids: [0, -1, x]\n",
		base + "x: &a [*a]\n",
		base + "timeouts: &t\n  hello: *t\n",
		"job: {name: a, token_env: T, local_size: 1}\npeers: ['[::1]:1', '127.0.0.1:1']\n",
		"job:\n  name: ?\n",
		"{",
		"- - -",
		"\t",
		"job: !!binary aGVsbG8=\n",
		"? |\n  a\n: b\n",
		"job:\n  <<: {name: x}\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.yaml")
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v", c, err)
		}
		if err != nil {
			var list ErrorList
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error %T is not a non-empty ErrorList: %v", err, err)
			}
			for _, e := range list {
				if e.Source != "fuzz.yaml" || e.Err == nil {
					t.Fatalf("malformed error %+v", e)
				}
				if e.Key != "" && e.Line < 1 {
					t.Fatalf("error without a line: %v", e)
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that Validate refuses: %v", err)
		}
		_ = c.ShapeDigest()
		_ = slog.AnyValue(c).Resolve()
		if _, err := c.ResolveRank(len(c.Peers) - 1); err != nil {
			t.Fatalf("ResolveRank(last) on a valid config: %v", err)
		}
	})
}
