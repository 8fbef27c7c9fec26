package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	cvd "github.com/collectived/collectived/clients/go"
	"github.com/collectived/collectived/daemon"
)

// startOne starts an in-process daemon serving a world of one node with
// local trainers, and returns its socket.
func startOne(tb testing.TB, local int) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "cvd-d-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	cfg := daemon.DefaultConfig()
	cfg.Job = "bench"
	cfg.Token = []byte("0123456789abcdef0123")
	cfg.Peers = []string{"127.0.0.1:1"}
	cfg.LocalSize = local
	cfg.SocketPath = filepath.Join(dir, "d.sock")
	d, err := daemon.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	d.Start()
	tb.Cleanup(func() { d.Close() })
	return cfg.SocketPath
}

// BenchmarkDaemonAllReduce is the sidecar's own cost: one trainer, one
// node, so the ring does nothing and what is measured is the client, the
// socket, the session and the engine.
func BenchmarkDaemonAllReduce(b *testing.B) {
	for _, size := range []int{4, 4096, 1 << 20} {
		for _, path := range []string{"inline", "shm"} {
			if path == "inline" && size > 64<<10 {
				continue
			}
			b.Run(fmt.Sprintf("%s/%dB", path, size), func(b *testing.B) {
				sock := startOne(b, 1)
				c, err := cvd.Dial(cvd.Options{Socket: sock, Job: "bench", LocalRank: 0})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				x := make([]float32, size/4)
				if path == "shm" {
					x, _, err = cvd.AllocSlice[float32](c, size/4)
					if err != nil {
						b.Fatal(err)
					}
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := cvd.AllReduce(c, x, cvd.Sum); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
