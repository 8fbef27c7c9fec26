package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// runApp runs the CLI with args and returns what it printed and its error,
// without exiting the test binary.
func runApp(t *testing.T, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	app.ExitErrHandler = func(*cli.Context, error) {}
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	err := app.Run(append([]string{"collectived"}, args...))
	return out.String(), err
}

// One file serves every node: --rank, --socket and --listen win over the
// file's rank, socket.path and listen, and an override is validated like
// the file's own value, its error naming the flag rather than the line of
// the file's value it replaced.
func TestFlagsOverrideFile(t *testing.T) {
	t.Setenv("FLAGS_TOKEN", "0123456789abcdef0123")
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	src := "job:\n  name: j\n  token_env: FLAGS_TOKEN\npeers:\n  - 127.0.0.1:7101\n  - 127.0.0.1:7102\n" +
		"rank: 0\nlisten: 127.0.0.1:7101\nsocket:\n  path: /run/collectived/file.sock\n"
	if err := os.WriteFile(cfg, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}

	out, err := runApp(t, "check", "--config", cfg)
	if want := "this node: rank 0, ring listen 127.0.0.1:7101, socket /run/collectived/file.sock (mode 0660)"; err != nil || !strings.Contains(out, want) {
		t.Fatalf("check without flags: %v\n%s\nwant %q", err, out, want)
	}

	out, err = runApp(t, "check", "--config", cfg, "--rank", "1", "--socket", "/tmp/flag.sock", "--listen", "0.0.0.0:7102")
	if want := "this node: rank 1, ring listen 0.0.0.0:7102, socket /tmp/flag.sock (mode 0660)"; err != nil || !strings.Contains(out, want) {
		t.Fatalf("check with flags: %v\n%s\nwant %q", err, out, want)
	}
	if !strings.Contains(out, "* node 1  127.0.0.1:7102") {
		t.Errorf("check with --rank 1 does not mark node 1:\n%s", out)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rank", "2"}, "rank: override 2 is out of range: 2 peers give ranks 0 to 1"},
		{[]string{"--socket", "relative.sock"}, `--socket: socket.path: "relative.sock" is not an absolute path`},
		{[]string{"--listen", "no-port"}, `--listen: listen: "no-port" is not host:port`},
	} {
		_, err := runApp(t, append([]string{"check", "--config", cfg}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("check %v: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

// A command's error names the program once, also when it comes from the
// Go client, whose errors already begin with "collectived:".
func TestErrorLineNamesProgramOnce(t *testing.T) {
	_, err := runApp(t, "status", "--socket", filepath.Join(t.TempDir(), "none.sock"), "--timeout", "1s")
	if err == nil {
		t.Fatal("status of a socket nobody serves succeeded")
	}
	line := errorLine(err)
	if !strings.HasPrefix(line, "collectived: ") || strings.Count(line, "collectived:") != 1 || !strings.Contains(line, "none.sock") {
		t.Errorf("status error line %q, want the program named once and the socket", line)
	}
	if line := errorLine(errors.New("config: bad")); line != "collectived: config: bad" {
		t.Errorf("errorLine = %q", line)
	}
}
