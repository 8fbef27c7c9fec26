package ipc

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSocketFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "collectived")
	cfg := DefaultServerConfig()
	cfg.Path = filepath.Join(dir, "d.sock")
	srv, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(cfg.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want socket 0660", fi.Mode())
	}
	if di, err := os.Stat(dir); err != nil || di.Mode().Perm() != 0o750 {
		t.Errorf("created directory mode %v, %v; want 0750", di.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("directory holds %d entries, want only the socket", len(ents))
	}

	// A live daemon's socket is not replaced.
	_, err = Listen(cfg)
	if !errors.Is(err, ErrSocketInUse) || !strings.Contains(err.Error(), cfg.Path) {
		t.Errorf("second Listen: %v, want ErrSocketInUse naming the path", err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Lstat(cfg.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after Close: %v", err)
	}

	// A stale socket (its daemon died without removing it) is replaced.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if _, err := net.Dial("unix", cfg.Path); !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("stale socket dial: %v", err)
	}
	cfg.Mode = 0o600
	srv, err = Listen(cfg)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	if fi, _ := os.Stat(cfg.Path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode())
	}
	h := newTestHandler()
	go srv.Serve(h)
	c := dial(t, cfg.Path)
	c.attach()

	// If another daemon has since taken the path, Close leaves its socket.
	os.Remove(cfg.Path)
	cfg2 := cfg
	srv2, err := Listen(cfg2)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	if _, err := os.Lstat(cfg.Path); err != nil {
		t.Errorf("Close removed another server's socket: %v", err)
	}
	srv2.Close()

	// Anything else at the path is left alone.
	if err := os.WriteFile(cfg.Path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(cfg); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("Listen over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(cfg.Path); string(b) != "precious" {
		t.Error("regular file was touched")
	}
}

func TestConfigVerify(t *testing.T) {
	if err := DefaultServerConfig().Verify(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	cases := []struct {
		mut  func(*ServerConfig)
		want string
	}{
		{func(c *ServerConfig) { c.Path = "" }, "socket path is empty"},
		{func(c *ServerConfig) { c.Path = "/" + strings.Repeat("x", 120) }, "the limit is 107"},
		{func(c *ServerConfig) { c.Mode = 0 }, "socket mode"},
		{func(c *ServerConfig) { c.Mode = os.ModeSetuid | 0o660 }, "permission bits only"},
		{func(c *ServerConfig) { c.HelloTimeout = 0 }, "hello timeout 0s"},
		{func(c *ServerConfig) { c.WriteTimeout = -1 }, "write timeout"},
		{func(c *ServerConfig) { c.InlineLimit = -1 }, "inline limit -1"},
		{func(c *ServerConfig) { c.InlineLimit = 1 << 30 }, "inline limit 1073741824"},
		{func(c *ServerConfig) { c.MaxInFlight = 0 }, "max in flight 0"},
		{func(c *ServerConfig) { c.ShmQuota = -1 }, "shm quota -1"},
		{func(c *ServerConfig) { c.MaxClients = 0 }, "max clients 0"},
		{func(c *ServerConfig) { c.MaxSegments = 0 }, "max segments 0 must be at least 1"},
	}
	for _, tc := range cases {
		cfg := DefaultServerConfig()
		tc.mut(&cfg)
		err := cfg.Verify()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Verify = %v, want %q", err, tc.want)
		}
		if _, lerr := Listen(cfg); lerr == nil {
			t.Errorf("Listen accepted a config Verify refuses (%s)", tc.want)
		}
	}
}

func TestAllowed(t *testing.T) {
	const self = 1000
	cases := []struct {
		c          Cred
		uids, gids []uint32
		want       bool
	}{
		{Cred{UID: 0, GID: 5}, nil, nil, true},
		{Cred{UID: self, GID: 5}, nil, nil, true},
		{Cred{UID: 1001, GID: 5}, nil, nil, false},
		{Cred{UID: 1001, GID: 5}, []uint32{1001}, nil, true},
		{Cred{UID: 1002, GID: 5}, []uint32{1001}, nil, false},
		{Cred{UID: 1002, GID: 5}, []uint32{1001}, []uint32{5}, true},
		{Cred{UID: 1002, GID: 6}, nil, []uint32{5}, false},
	}
	for _, tc := range cases {
		if got := allowed(tc.c, self, tc.uids, tc.gids); got != tc.want {
			t.Errorf("allowed(%+v, uids %v, gids %v) = %v", tc.c, tc.uids, tc.gids, got)
		}
	}
}

func TestPeerCredInProcess(t *testing.T) {
	srv, h := startServer(t, nil)
	c := dial(t, srv.Path())
	c.attach()
	h.mu.Lock()
	pids := h.pids
	h.mu.Unlock()
	if len(pids) != 1 || pids[0] != int32(os.Getpid()) {
		t.Errorf("session pids %v, want [%d]", pids, os.Getpid())
	}
}

func TestMaxClients(t *testing.T) {
	srv, _ := startServer(t, func(c *ServerConfig) { c.MaxClients = 1 })
	a := dial(t, srv.Path())
	a.attach()
	b := dial(t, srv.Path())
	b.expectError(b.read(), CodeFull, true, "at most 1 connections")
	if f := a.inlineCall(5, make([]byte, 4), ""); f.Type != TypeCallOK {
		t.Fatalf("first client: %s", f.Type)
	}
}

// Close tells every session (SHUTDOWN, then the handler), removes the
// socket, and makes Serve return; answers to calls still held by the core
// are dropped harmlessly and their segments unmapped.
func TestServerCloseWithCallsInFlight(t *testing.T) {
	base := openFds(t)
	cfg := DefaultServerConfig()
	cfg.Path = filepath.Join(t.TempDir(), "d.sock")
	srv, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := newTestHandler()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(h) }()
	c := dial(t, cfg.Path)
	c.attach()
	seg, _ := c.alloc(4096)
	h.setHold()
	c.send((&Call{Desc: descInt32(16, ""), SHM: true, Segment: seg.Segment}).Encode(50), -1)
	c.send((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(51), -1)
	for {
		h.mu.Lock()
		n := len(h.held)
		h.mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	ev := h.waitGone(t)
	if !errors.Is(ev.cause, ErrShutdown) {
		t.Errorf("Disconnected cause %v, want SHUTDOWN", ev.cause)
	}
	c.expectError(c.read(), CodeShutdown, true, "the daemon is stopping")
	if _, err := os.Lstat(cfg.Path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket not removed: %v", err)
	}
	h.release()
	c.c.Close()
	waitFds(t, base)
	if err := srv.Serve(h); err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
}
