package logthrottle

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/collectived/collectived/internal/syncbuf"
)

// lockedBuf is the log the throttle writes, read while it may write.
type lockedBuf struct{ syncbuf.Buffer }

func (l *lockedBuf) lines() []string {
	s := strings.TrimRight(l.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func newTest(buf *lockedBuf, maxSources int) *Throttle {
	log := slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	return New(Config{Logger: log, Prefix: "rendezvous", Msg: "refused connection", Noun: "connections refused", MaxSources: maxSources})
}

// A flood from one source: Burst lines in full, then one summary per
// window with the count, then nothing once it stops; after a quiet window
// the next event is logged in full again.
func TestFloodIsSummarised(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuf
		th := newTest(&buf, 0)
		defer th.Close()
		for i := range 1234 {
			th.Log(slog.LevelWarn, "bad magic", "10.0.0.9", fmt.Sprintf("detail %d", i), "remote", fmt.Sprintf("10.0.0.9:%d", 1000+i))
		}
		if got := len(buf.lines()); got != DefaultBurst {
			t.Fatalf("%d lines during the first burst, want %d:\n%s", got, DefaultBurst, strings.Join(buf.lines(), "\n"))
		}
		time.Sleep(DefaultWindow + time.Millisecond)
		lines := buf.lines()
		if len(lines) != DefaultBurst+1 {
			t.Fatalf("%d lines after the window, want %d", len(lines), DefaultBurst+1)
		}
		want := `msg="rendezvous: 1,234 connections refused from 10.0.0.9 in the last 10s: bad magic" count=1234 logged_in_full=5 source=10.0.0.9 reason="bad magic" window=10s last="detail 1233"`
		if !strings.Contains(lines[DefaultBurst], want) || !strings.Contains(lines[DefaultBurst], "level=WARN") {
			t.Fatalf("summary\n%s\nwant\n%s", lines[DefaultBurst], want)
		}
		// Still flooding: summaries only, one per window.
		for w := range 3 {
			for range 100 {
				th.Log(slog.LevelWarn, "bad magic", "10.0.0.9", "more")
			}
			time.Sleep(DefaultWindow)
			lines = buf.lines()
			if len(lines) != DefaultBurst+2+w || !strings.Contains(lines[len(lines)-1], "count=100 logged_in_full=0") {
				t.Fatalf("window %d of the flood: %d lines, the last %q", w, len(lines), lines[len(lines)-1])
			}
		}
		// A quiet window: nothing more, and the key is forgotten.
		time.Sleep(2 * DefaultWindow)
		n := len(buf.lines())
		if n != DefaultBurst+4 {
			t.Fatalf("%d lines after the flood stopped, want %d", n, DefaultBurst+4)
		}
		if !th.Log(slog.LevelWarn, "bad magic", "10.0.0.9", "") {
			t.Fatal("the first event after a quiet window was not logged in full")
		}
		c := th.Snapshot()
		if c.Total != 1234+300+1 || c.Reasons["bad magic"] != c.Total || len(c.Sources) != 1 || c.Sources[0].Count != c.Total {
			t.Fatalf("counts %+v", c)
		}
	})
}

// Kinds and sources are throttled apart; beyond MaxSources, new sources
// share one key, so the lines of a flood from many addresses stay bounded.
func TestSourcesBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuf
		th := newTest(&buf, 4)
		for src := range 100 {
			for range 20 {
				th.Log(slog.LevelInfo, "other job", fmt.Sprintf("10.0.0.%d", src), "")
				th.Log(slog.LevelInfo, "bad magic", fmt.Sprintf("10.0.0.%d", src), "")
			}
		}
		// Four keys tracked (two sources x two kinds), the rest under
		// "other sources" (one per kind): burst each.
		if got := len(buf.lines()); got != 6*DefaultBurst {
			t.Fatalf("%d lines, want %d", got, 6*DefaultBurst)
		}
		time.Sleep(DefaultWindow + time.Millisecond)
		if got := len(buf.lines()); got != 6*DefaultBurst+6 {
			t.Fatalf("%d lines after the window, want %d with a summary per key", got, 6*DefaultBurst+6)
		}
		found := false
		for _, l := range buf.lines() {
			found = found || strings.Contains(l, "from other sources in the last 10s: bad magic")
		}
		if !found {
			t.Fatalf("no summary of other sources:\n%s", strings.Join(buf.lines(), "\n"))
		}
		c := th.Snapshot()
		if c.Total != 4000 || len(c.Sources) != 6 || c.Sources[0].Source != OtherSources || c.Sources[0].Count != 98*20 {
			t.Fatalf("counts %+v", c)
		}
		th.Close()
	})
}

// Close logs the summaries still due.
func TestCloseFlushes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf lockedBuf
		th := newTest(&buf, 0)
		for range 10 {
			th.Log(slog.LevelWarn, "PERMISSION", "uid 65534", "")
		}
		th.Close()
		lines := buf.lines()
		if len(lines) != DefaultBurst+1 || !strings.Contains(lines[DefaultBurst], "10 connections refused from uid 65534") {
			t.Fatalf("lines after Close:\n%s", strings.Join(lines, "\n"))
		}
		time.Sleep(2 * DefaultWindow)
		if len(buf.lines()) != DefaultBurst+1 {
			t.Fatal("a timer fired after Close")
		}
	})
}

func TestThousands(t *testing.T) {
	for n, want := range map[uint64]string{0: "0", 999: "999", 1000: "1,000", 1234: "1,234", 1234567: "1,234,567", 100000: "100,000"} {
		if got := Thousands(n); got != want {
			t.Errorf("Thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
