package logthrottle

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"
)

// Defaults.
const (
	DefaultWindow     = 10 * time.Second
	DefaultBurst      = 5
	DefaultMaxSources = 64
)

// OtherSources is the source under which events are counted once
// MaxSources sources are tracked.
const OtherSources = "other sources"

// Config configures a Throttle.
type Config struct {
	Logger *slog.Logger // nil discards
	// Prefix starts each summary ("rendezvous"); Msg is the message of
	// the lines logged in full ("rendezvous refused connection"); Noun
	// names what is counted in summaries ("connections refused").
	Prefix, Msg, Noun string
	Window            time.Duration // 0: DefaultWindow
	Burst             int           // 0: DefaultBurst
	MaxSources        int           // 0: DefaultMaxSources
}

// Throttle is safe for concurrent use.
type Throttle struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	closed  bool
	live    map[key]*entry // keys logged or counted in the current spell
	total   uint64
	reasons map[string]uint64
	sources map[key]*SourceCount // from the start, at most MaxSources
}

type key struct{ kind, source string }

// entry is one key's current window.
type entry struct {
	level  slog.Level
	logged int    // lines logged in full in this window
	n      uint64 // events in this window (logged or not)
	hot    bool   // a summary was due at the last window's end
	last   string // the last suppressed event's detail
	timer  *time.Timer
}

// New returns a Throttle with cfg's zero fields defaulted.
func New(cfg Config) *Throttle {
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.MaxSources <= 0 {
		cfg.MaxSources = DefaultMaxSources
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Throttle{cfg: cfg, log: log, live: make(map[key]*entry),
		reasons: make(map[string]uint64), sources: make(map[key]*SourceCount)}
}

// Log records one event of kind from source. It is logged in full, as
// msg with attrs (Config.Msg when msg is ""), unless the key has had
// Burst lines in its window or is being summarised; then it is counted,
// and detail (a short description of this event, for the summary) kept.
// It reports whether the line was logged.
func (t *Throttle) Log(level slog.Level, kind, source, detail string, attrs ...any) bool {
	now := time.Now()
	t.mu.Lock()
	t.count(kind, source, now)
	k := key{kind, source}
	e, ok := t.live[k]
	if !ok && len(t.live) >= t.cfg.MaxSources {
		k.source = OtherSources
		e, ok = t.live[k]
	}
	if !ok {
		e = &entry{level: level}
		if !t.closed {
			t.live[k] = e
			e.timer = time.AfterFunc(t.cfg.Window, func() { t.tick(k, e) })
		}
	}
	e.n++
	full := !e.hot && e.logged < t.cfg.Burst
	if full {
		e.logged++
	} else {
		e.last = detail
		e.level = max(e.level, level)
	}
	t.mu.Unlock()
	if full {
		t.log.Log(context.Background(), level, t.cfg.Msg, attrs...)
	}
	return full
}

// count adds the event to the totals. The caller holds t.mu.
func (t *Throttle) count(kind, source string, now time.Time) {
	t.total++
	t.reasons[kind]++
	k := key{kind, source}
	sc, ok := t.sources[k]
	if !ok && len(t.sources) >= t.cfg.MaxSources {
		k.source = OtherSources
		sc, ok = t.sources[k]
	}
	if !ok {
		sc = &SourceCount{Source: k.source, Reason: kind}
		t.sources[k] = sc
	}
	sc.Count++
	sc.Last = now
}

// tick ends e's window: a summary if events went unlogged, then either a
// new window or, after a quiet one, the key is forgotten.
func (t *Throttle) tick(k key, e *entry) {
	t.mu.Lock()
	if t.live[k] != e {
		t.mu.Unlock()
		return
	}
	n, logged, last, level := e.n, e.logged, e.last, e.level
	suppressed := n > uint64(logged)
	if suppressed {
		e.hot, e.n, e.logged, e.last = true, 0, 0, ""
		e.timer.Reset(t.cfg.Window)
	} else {
		delete(t.live, k)
	}
	t.mu.Unlock()
	if suppressed {
		t.summary(level, k, n, logged, last)
	}
}

func (t *Throttle) summary(level slog.Level, k key, n uint64, logged int, last string) {
	msg := fmt.Sprintf("%s: %s %s from %s in the last %v: %s", t.cfg.Prefix, Thousands(n), t.cfg.Noun, k.source, t.cfg.Window, k.kind)
	attrs := []any{"count", n, "logged_in_full", logged, "source", k.source, "reason", k.kind, "window", t.cfg.Window}
	if last != "" {
		attrs = append(attrs, "last", last)
	}
	t.log.Log(context.Background(), level, msg, attrs...)
}

// Close stops the timers and logs the summaries still due. Events after
// Close are counted and logged in full.
func (t *Throttle) Close() {
	t.mu.Lock()
	t.closed = true
	type due struct {
		k       key
		e       entry
		pending bool
	}
	var dues []due
	for k, e := range t.live {
		e.timer.Stop()
		dues = append(dues, due{k, *e, e.n > uint64(e.logged)})
	}
	t.live = make(map[key]*entry)
	t.mu.Unlock()
	sort.Slice(dues, func(i, j int) bool {
		return dues[i].k.kind < dues[j].k.kind || (dues[i].k.kind == dues[j].k.kind && dues[i].k.source < dues[j].k.source)
	})
	for _, d := range dues {
		if d.pending {
			t.summary(d.e.level, d.k, d.e.n, d.e.logged, d.e.last)
		}
	}
}

// Counts is what a Throttle has counted since it was made.
type Counts struct {
	Total   uint64            `json:"total"`
	Reasons map[string]uint64 `json:"reasons,omitempty"`
	// Sources are by count, most first; events from sources beyond the
	// first MaxSources are under OtherSources.
	Sources []SourceCount `json:"sources,omitempty"`
}

// SourceCount is the events of one kind from one source.
type SourceCount struct {
	Source string    `json:"source"`
	Reason string    `json:"reason"`
	Count  uint64    `json:"count"`
	Last   time.Time `json:"last"`
}

// Snapshot returns the counts so far.
func (t *Throttle) Snapshot() Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := Counts{Total: t.total}
	if len(t.reasons) > 0 {
		c.Reasons = make(map[string]uint64, len(t.reasons))
		for k, v := range t.reasons {
			c.Reasons[k] = v
		}
	}
	for _, sc := range t.sources {
		c.Sources = append(c.Sources, *sc)
	}
	sort.Slice(c.Sources, func(i, j int) bool {
		a, b := c.Sources[i], c.Sources[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Source < b.Source || (a.Source == b.Source && a.Reason < b.Reason)
	})
	return c
}

// Thousands writes n with commas between groups of three digits.
func Thousands(n uint64) string {
	s := strconv.FormatUint(n, 10)
	if len(s) <= 3 {
		return s
	}
	b := make([]byte, 0, len(s)+len(s)/3)
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, s[i])
	}
	return string(b)
}
