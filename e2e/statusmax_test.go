package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	cvd "github.com/collectived/collectived/clients/go"
)

// statusCLI runs `collectived status --json` against socket and returns
// the document.
func statusCLI(t *testing.T, socket string) []byte {
	t.Helper()
	out, err := exec.Command(daemonBin, "status", "--socket", socket, "--job", "e2e", "--json").CombinedOutput()
	if err != nil {
		t.Fatalf("collectived status: %v: %s", err, out)
	}
	return out
}

type statusTrainers struct {
	LocalSize int `json:"local_size"`
	Trainers  []struct {
		LocalRank int    `json:"local_rank"`
		Attached  bool   `json:"attached"`
		Label     string `json:"label"`
	} `json:"trainers"`
}

// TestStatusAtTheMaxima: `collectived status` answers at the largest legal
// shapes, where the document is larger than max_frame (64 KiB here):
// local_size 1024 (the maximum) with no trainer attached, and local_size
// 256 with 200 trainers whose labels are 255 bytes, plain and made of
// control characters (each escaped to 6 bytes in JSON). Before the fix
// each got INTERNAL ("over max_frame").
func TestStatusAtTheMaxima(t *testing.T) {
	t.Run("local_size 1024, nothing attached", func(t *testing.T) {
		w := startWorld(t, 1, 1024, fastTimeouts+"limits:\n  max_clients: 1100\n")
		var st statusTrainers
		out := statusCLI(t, w.sockets[0])
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("%v: %.300s", err, out)
		}
		if st.LocalSize != 1024 || len(st.Trainers) != 1024 || st.Trainers[1023].LocalRank != 1023 {
			t.Fatalf("local size %d, %d trainers listed; want 1024 of each", st.LocalSize, len(st.Trainers))
		}
		t.Logf("STATUS_OK of %d bytes", len(out))
	})
	for _, lc := range []struct{ name, label string }{
		{"plain labels", strings.Repeat("l", 255)},
		{"labels of control characters", strings.Repeat("\x01", 255)},
	} {
		t.Run("local_size 256, 200 trainers, "+lc.name, func(t *testing.T) {
			w := startWorld(t, 1, 256, "")
			for i := range 200 {
				label := fmt.Sprintf("%03d", i) + lc.label[3:]
				cl, err := cvd.Dial(cvd.Options{Socket: w.sockets[0], Job: "e2e", LocalRank: i, Label: label,
					Timeout: 10 * time.Second, DialTimeout: 10 * time.Second, NoLane: true})
				if err != nil {
					t.Fatalf("trainer %d: %v", i, err)
				}
				t.Cleanup(func() { cl.Close() })
			}
			out := statusCLI(t, w.sockets[0])
			var st statusTrainers
			if err := json.Unmarshal(out, &st); err != nil {
				t.Fatalf("%v: %.300s", err, out)
			}
			attached := 0
			for _, tr := range st.Trainers {
				if tr.Attached {
					attached++
					if want := fmt.Sprintf("%03d", tr.LocalRank) + lc.label[3:]; tr.Label != want {
						t.Fatalf("local rank %d's label %q, want %q", tr.LocalRank, tr.Label, want)
					}
				}
			}
			if attached != 200 {
				t.Fatalf("%d trainers attached in the status, want 200", attached)
			}
			t.Logf("STATUS_OK of %d bytes", len(out))
		})
	}
}
