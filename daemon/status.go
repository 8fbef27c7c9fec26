package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/collectived/collectived/internal/logthrottle"
	"github.com/collectived/collectived/ipc"
)

// Status is the daemon's state as `collectived status` shows it and as the
// STATUS_OK frame carries it (JSON; clients ignore fields they do not know).
type Status struct {
	Job        string          `json:"job"`
	NodeRank   int             `json:"node_rank"`
	NodeCount  int             `json:"node_count"`
	LocalSize  int             `json:"local_size"`
	Ring       RingStatus      `json:"ring"`
	Trainers   []TrainerStatus `json:"trainers"`
	InFlight   *InFlightStatus `json:"in_flight,omitempty"`
	Socket     string          `json:"socket"`
	Listen     string          `json:"listen"`
	Peers      []string        `json:"peers"`
	Process    ProcessStatus   `json:"process"`
	Refused    RefusedStatus   `json:"refused"`
	Named      NamedStatus     `json:"named"`
	ReportedAt time.Time       `json:"reported_at"`
	// Truncated says what was left out to keep the document within
	// ipc.MaxStatusFrame; empty at every legal configuration.
	Truncated string `json:"truncated,omitempty"`
}

// RefusedStatus counts the connections refused since the daemon started,
// by reason and by reason and source: on the ring port (source: the
// remote IP) and on the Unix socket before admission (source: the uid).
// The log shows the first few of each kind and source, then a summary
// per 10 s (docs/SECURITY.md).
type RefusedStatus struct {
	Ring   logthrottle.Counts `json:"ring"`
	Socket logthrottle.Counts `json:"socket"`
}

// RingStatus is the ring's state and last failure.
type RingStatus struct {
	State      string `json:"state"` // forming, up, failed, stopped
	Generation uint32 `json:"generation"`
	// Finished: the collectives this node has finished, completed or
	// failed: the world's number of its next (docs/MATCHING.md).
	Finished  uint64 `json:"finished"`
	Next      string `json:"next,omitempty"`
	Prev      string `json:"prev,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Op, Step: the ring op under way and its step (empty when idle);
	// HeardFromNextSec, HeardFromPrevSec: seconds since a frame last came
	// from each neighbour, which tells a slow peer from a silent one.
	Op               string  `json:"op,omitempty"`
	Step             int     `json:"step,omitempty"`
	HeardFromNextSec float64 `json:"heard_from_next_sec,omitempty"`
	HeardFromPrevSec float64 `json:"heard_from_prev_sec,omitempty"`
	// BufferBytes is the ring's pipeline buffers (ring.Status.BufferBytes).
	BufferBytes int64 `json:"buffer_bytes,omitempty"`
}

// TrainerStatus is one local rank's slot.
type TrainerStatus struct {
	LocalRank int    `json:"local_rank"`
	WorldRank int    `json:"world_rank"`
	Attached  bool   `json:"attached"`
	PID       int32  `json:"pid,omitempty"`
	Label     string `json:"label,omitempty"`
	Calls     uint64 `json:"calls"`
	LastCall  string `json:"last_call,omitempty"`
	Queued    int    `json:"queued"`
	// Owes: failed collectives this rank had not called; its next calls
	// get their errors (docs/MATCHING.md).
	Owes int `json:"owes,omitempty"`
	// Lane: the trainer's small calls come through its lane of shared
	// memory (protocol version 2) rather than the socket.
	Lane bool `json:"lane,omitempty"`
}

// NamedStatus is the state of named calls (docs/MATCHING.md, "Named
// calls"): the names waiting and for whom, and counters since the daemon
// started.
type NamedStatus struct {
	Pending []NamedWaiting `json:"pending,omitempty"` // at most maxStatusNames
	// Rounds: negotiation rounds run; Executed: names run (one per name
	// and occurrence); FusedOps: ring operations that carried several.
	Rounds   uint64      `json:"rounds"`
	Executed uint64      `json:"executed"`
	FusedOps uint64      `json:"fused_ops"`
	Cache    CacheStatus `json:"cache"`
}

// CacheStatus is the response cache of named calls (namecache.go): hits
// count names a round carried as a bit, misses those that travelled in
// full.
type CacheStatus struct {
	Entries       int    `json:"entries"`
	Hits          uint64 `json:"hits"`
	Misses        uint64 `json:"misses"`
	Invalidations uint64 `json:"invalidations"`
}

// maxStatusNames bounds the names waiting that status lists.
const maxStatusNames = 64

// InFlightStatus is the collective being waited for or run, and on whom.
type InFlightStatus struct {
	Seq       uint64  `json:"seq"`
	Phase     string  `json:"phase"`
	Call      string  `json:"call,omitempty"`
	WaitedSec float64 `json:"waited_sec"`
	NotCalled string  `json:"not_called,omitempty"`
}

// Status reports the daemon's state.
func (d *Daemon) Status() Status {
	ps := processStatus() // reads /proc: not under the daemon's lock
	refused := RefusedStatus{Ring: d.rv.Refusals(), Socket: d.srv.Refusals()}
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(d.cfg.Peers)
	st := Status{
		Job: d.cfg.Job, NodeRank: d.cfg.Rank, NodeCount: n, LocalSize: d.cfg.LocalSize,
		Socket: d.cfg.SocketPath, Listen: d.RingAddr(), Peers: d.cfg.Peers,
		ReportedAt: time.Now().UTC(), Process: ps,
		Refused: refused,
		Ring:    RingStatus{State: d.state, Generation: d.gen, Finished: d.match.finished},
	}
	if n > 1 {
		st.Ring.Next = d.cfg.Peers[(d.cfg.Rank+1)%n]
		st.Ring.Prev = d.cfg.Peers[(d.cfg.Rank+n-1)%n]
	}
	if d.lastErr != nil {
		st.Ring.LastError = clip(d.lastErr.Error(), maxStatusError)
	}
	if d.ring != nil {
		rs := d.ring.Status()
		st.Ring.BufferBytes = rs.BufferBytes
		if rs.Op != 0 {
			st.Ring.Op, st.Ring.Step = fmt.Sprintf("%s seq %d", rs.Op, rs.Seq), rs.Step
		}
		if !rs.LastFromNext.IsZero() && rs.LastFromNext.Unix() > 0 {
			st.Ring.HeardFromNextSec = time.Since(rs.LastFromNext).Seconds()
			st.Ring.HeardFromPrevSec = time.Since(rs.LastFromPrev).Seconds()
		}
	}
	for l := range d.slots {
		s := &d.slots[l]
		ts := TrainerStatus{LocalRank: l, WorldRank: d.worldRank(l), Attached: s.session != nil,
			PID: s.pid, Label: s.label, Calls: s.calls, Queued: d.match.queueLen(l), Owes: d.match.owes(l)}
		if s.session != nil {
			ts.Lane = s.session.HasLane()
		}
		if s.calls > 0 {
			ts.LastCall = s.last.String()
		}
		st.Trainers = append(st.Trainers, ts)
	}
	c := &d.nm.cache
	st.Named = NamedStatus{Rounds: d.nm.rounds, Executed: d.nm.executed, FusedOps: d.nm.fusedOps,
		Cache: CacheStatus{Entries: len(c.entries), Hits: c.hits, Misses: c.misses, Invalidations: c.invalidations}}
	if d.match.named > 0 || len(d.nm.res.waiting) > 0 {
		st.Named.Pending = d.waitingLocked(nil)
		if len(st.Named.Pending) > maxStatusNames {
			st.Named.Pending = st.Named.Pending[:maxStatusNames]
		}
	}
	if f := d.inflight; f.active {
		in := &InFlightStatus{Seq: f.seq, Phase: f.phase, WaitedSec: time.Since(f.since).Seconds()}
		if f.desc.Op != 0 {
			in.Call = f.desc.String()
		}
		if f.phase == phaseLocal {
			in.NotCalled = d.missingLocked()
		}
		st.InFlight = in
	}
	return st
}

// maxStatusError bounds an error message in the status document: errors
// are built by the daemon, but may quote what peers said.
const maxStatusError = 4096

// clip cuts s to at most n bytes, at a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// statusJSON is the STATUS_OK document. It is at most ipc.MaxStatusFrame
// bytes at every legal configuration (TestStatusDocumentAtTheMaxima);
// were it longer, labels, calls and the peer list are left out and
// Truncated says so. One document is built at a time, so that many
// observers asking at once at the largest configurations do not each
// hold megabytes being built.
func (d *Daemon) statusJSON() ([]byte, error) {
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	return encodeStatus(d.Status())
}

func encodeStatus(st Status) ([]byte, error) {
	doc, err := marshalStatus(&st)
	if err != nil || len(doc) <= ipc.MaxStatusFrame {
		return doc, err
	}
	n := len(doc)
	for i := range st.Trainers {
		st.Trainers[i].Label, st.Trainers[i].LastCall = "", ""
	}
	st.Peers = nil
	if st.InFlight != nil {
		st.InFlight.Call, st.InFlight.NotCalled = "", ""
	}
	st.Truncated = fmt.Sprintf("the whole document was %d bytes, over the %d-byte bound of STATUS_OK: trainers' labels and last calls, the peer list and the call in flight are left out",
		n, ipc.MaxStatusFrame)
	if doc, err = marshalStatus(&st); err == nil && len(doc) > ipc.MaxStatusFrame {
		err = fmt.Errorf("the status document is %d bytes even without labels and peers, over the %d-byte bound of STATUS_OK", len(doc), ipc.MaxStatusFrame)
	}
	return doc, err
}

// marshalStatus encodes without HTML escaping: '<' in a label stays one
// byte, not six.
func marshalStatus(st *Status) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(st); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
