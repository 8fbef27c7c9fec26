package ipc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A daemon restarted while its predecessor still answers on the socket
// waits for it to go, then takes the socket.
func TestListenWaitsForLiveSocket(t *testing.T) {
	cfg := DefaultServerConfig()
	cfg.Path = filepath.Join(t.TempDir(), "d.sock")
	old, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(1500 * time.Millisecond)
		old.Close()
		released <- time.Now()
	}()
	cfg.BindTimeout = 15 * time.Second
	start := time.Now()
	srv, err := Listen(cfg)
	rel := <-released
	if err != nil {
		t.Fatalf("Listen with the old daemon gone after 1.5s of a 15s bind timeout: %v", err)
	}
	defer srv.Close()
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Errorf("Listen returned after %v, before the old socket closed", took)
	}
	if late := time.Since(rel); late > 2*time.Second {
		t.Errorf("Listen bound %v after the old socket closed; want within 2s (if the machine is overloaded, rerun with fewer parallel tests)", late)
	}
	if _, err := os.Lstat(cfg.Path); err != nil {
		t.Errorf("new socket: %v", err)
	}
}

// A live socket past the bind timeout fails Listen with ErrSocketInUse,
// naming the path and the process answering on it (this one).
func TestListenLiveSocketTimeout(t *testing.T) {
	cfg := DefaultServerConfig()
	cfg.Path = filepath.Join(t.TempDir(), "d.sock")
	srv, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cfg.BindTimeout = 500 * time.Millisecond
	start := time.Now()
	second, err := Listen(cfg)
	if err == nil {
		second.Close()
		t.Fatal("second Listen on a live socket succeeded")
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("gave up after %v, before the 500ms bind timeout", took)
	}
	if !errors.Is(err, ErrSocketInUse) {
		t.Errorf("error does not wrap ErrSocketInUse: %v", err)
	}
	for _, want := range []string{cfg.Path, "still in use after", fmt.Sprintf("held by pid %d (", os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestNegativeBindTimeout(t *testing.T) {
	cfg := DefaultServerConfig()
	cfg.Path = filepath.Join(t.TempDir(), "d.sock")
	cfg.BindTimeout = -time.Second
	if _, err := Listen(cfg); err == nil || !strings.Contains(err.Error(), "bind timeout -1s is negative") {
		t.Errorf("negative bind timeout: %v", err)
	}
}
