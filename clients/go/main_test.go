package collectived_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/collectived/collectived/daemon"
)

// TestMain starts a real daemon in this process (a world of one node with
// one trainer) and points COLLECTIVED_SOCKET and COLLECTIVED_JOB at it, so
// that the examples run as a user would write them.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cvd-go-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg := daemon.DefaultConfig()
	cfg.Job = "example"
	cfg.Token = []byte("0123456789abcdef0123")
	cfg.Peers = []string{"127.0.0.1:1"}
	cfg.SocketPath = filepath.Join(dir, "collectived.sock")
	d, err := daemon.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	d.Start()
	os.Setenv("COLLECTIVED_SOCKET", cfg.SocketPath)
	os.Setenv("COLLECTIVED_JOB", "example")
	code := m.Run()
	d.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}
