package daemon_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/daemon"
	"github.com/collectived/collectived/internal/localworld"
	"github.com/collectived/collectived/internal/syncbuf"
)

// topKeys returns the keys of a JSON object in order, repeats included
// (encoding/json would keep only the last of a repeated key).
func topKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// Every line a daemon logs names each key once, job and node included: a
// JSON log with a repeated key is ambiguous to whatever reads it (most
// parsers keep only one). A two-node world forms its ring, runs a call
// and shuts down, which logs the rendezvous, the ring, the socket server
// and the core.
func TestLogKeysAppearOnce(t *testing.T) {
	dir, err := os.MkdirTemp("", "cvd-log-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ports, err := localworld.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	var peers []string
	for _, p := range ports {
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", p))
	}
	var logs [2]syncbuf.Buffer
	var ds []*daemon.Daemon
	for rank := range 2 {
		cfg := daemon.DefaultConfig()
		cfg.Job, cfg.Token, cfg.Peers, cfg.Rank = "logs", []byte("0123456789abcdef0123"), peers, rank
		cfg.SocketPath = filepath.Join(dir, fmt.Sprintf("n%d.sock", rank))
		cfg.ConnectTimeout = 20 * time.Second
		cfg.Logger = slog.New(slog.NewJSONHandler(&logs[rank], &slog.HandlerOptions{Level: slog.LevelDebug}))
		d, err := daemon.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		d.Start()
		ds = append(ds, d)
	}
	errs := make(chan error, 2)
	for rank := range 2 {
		go func() {
			c, err := cvd.Dial(cvd.Options{Socket: filepath.Join(dir, fmt.Sprintf("n%d.sock", rank)), Job: "logs", LocalRank: -1, Timeout: 30 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			x := []float32{float32(rank + 1)}
			if err := cvd.AllReduce(c, x, cvd.Sum); err != nil {
				errs <- err
				return
			}
			if x[0] != 3 {
				errs <- fmt.Errorf("rank %d got %v, want 3", rank, x[0])
				return
			}
			errs <- nil
		}()
	}
	for range 2 {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("the allreduce did not finish within 60s")
		}
	}
	for _, d := range ds {
		d.Close()
	}
	for rank := range logs {
		out := logs[rank].String()
		for _, want := range []string{"ring formed", "rendezvous formed", "trainer attached", "client attached"} {
			if !strings.Contains(out, want) {
				t.Errorf("node %d's log lacks %q:\n%s", rank, want, out)
			}
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			keys, err := topKeys(sc.Bytes())
			if err != nil {
				t.Fatalf("node %d logged %q: %v", rank, sc.Text(), err)
			}
			seen := map[string]bool{}
			for _, k := range keys {
				if seen[k] {
					t.Errorf("node %d logged key %q twice: %s", rank, k, sc.Text())
				}
				seen[k] = true
			}
			if !seen["job"] || (!seen["node"] && !seen["rank"]) {
				t.Errorf("node %d logged a line without its job and node: %s", rank, sc.Text())
			}
		}
	}
}
