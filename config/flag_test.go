package config

import (
	"errors"
	"testing"
)

// A value replaced by a command-line flag is reported under the flag: the
// file's line no longer holds what was checked. Other keys keep their lines.
func TestSetByFlag(t *testing.T) {
	c := mustParse(t, base+"socket:\n  path: /run/x.sock\n  mode: \"0660\"\n")
	c.Socket.Path = "relative.sock"
	c.SetByFlag("socket.path", "--socket")
	c.Socket.Mode = 0o1000
	err := c.Validate()
	var list ErrorList
	if !errors.As(err, &list) || len(list) != 2 {
		t.Fatalf("Validate = %v, want two errors", err)
	}
	got := map[string]string{}
	for _, e := range list {
		got[e.Key] = e.Error()
	}
	if want := `--socket: socket.path: "relative.sock" is not an absolute path`; got["socket.path"] != want {
		t.Errorf("flag-set key: %q, want %q", got["socket.path"], want)
	}
	if want := "config.yaml:9: socket.mode:"; len(got["socket.mode"]) < len(want) || got["socket.mode"][:len(want)] != want {
		t.Errorf("file key: %q, want it at %q", got["socket.mode"], want)
	}

	// A config built in code can take flags too.
	d := Default()
	d.Job.Name, d.Job.TokenEnv, d.Peers = "demo", "T", []string{"127.0.0.1:1"}
	d.Listen = "no-port"
	d.SetByFlag("listen", "--listen")
	if err := d.Validate(); err == nil || err.Error() != `--listen: listen: "no-port" is not host:port (write an IPv6 address as [::1]:7070)` {
		t.Errorf("code-built config: %v", err)
	}
}
