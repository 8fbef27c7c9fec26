package ipc

import (
	"os"
	"regexp"
	"strconv"
	"testing"
)

// The C client's header states the protocol version twice, in its opening
// comment and in CVD_PROTOCOL_VERSION; both once fell behind the other
// (the comment said 1 while the constant said 2). They must say what this
// package speaks, and the oldest version the comment offers must be one
// the daemon serves.
func TestCHeaderVersion(t *testing.T) {
	h, err := os.ReadFile("../clients/c/collectived.h")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ what, re string }{
		{"CVD_PROTOCOL_VERSION", `(?m)^#define CVD_PROTOCOL_VERSION (\d+)`},
		{"the opening comment", `\A/\*\s*\n \* collectived\.h - C client of collectived, client protocol version (\d+)`},
	} {
		m := regexp.MustCompile(c.re).FindSubmatch(h)
		if m == nil {
			t.Errorf("collectived.h: %s not found", c.what)
			continue
		}
		if v, _ := strconv.Atoi(string(m[1])); v != Version {
			t.Errorf("collectived.h: %s says version %d, ipc.Version is %d", c.what, v, Version)
		}
	}
	m := regexp.MustCompile(`against an older daemon it speaks [\d, or]*?(\d+)\)`).FindSubmatch(h)
	if m == nil {
		t.Fatal("collectived.h: the opening comment names no fallback versions")
	}
	if v, _ := strconv.Atoi(string(m[1])); v != MinVersion {
		t.Errorf("collectived.h: the oldest version the comment offers is %d, ipc.MinVersion is %d", v, MinVersion)
	}
}
