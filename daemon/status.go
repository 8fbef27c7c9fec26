package daemon

import (
	"encoding/json"
	"fmt"
	"time"
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
	ReportedAt time.Time       `json:"reported_at"`
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
	d.mu.Lock()
	defer d.mu.Unlock()
	n := len(d.cfg.Peers)
	st := Status{
		Job: d.cfg.Job, NodeRank: d.cfg.Rank, NodeCount: n, LocalSize: d.cfg.LocalSize,
		Socket: d.cfg.SocketPath, Listen: d.RingAddr(), Peers: d.cfg.Peers,
		ReportedAt: time.Now().UTC(), Process: ps,
		Ring: RingStatus{State: d.state, Generation: d.gen, Finished: d.match.finished},
	}
	if n > 1 {
		st.Ring.Next = d.cfg.Peers[(d.cfg.Rank+1)%n]
		st.Ring.Prev = d.cfg.Peers[(d.cfg.Rank+n-1)%n]
	}
	if d.lastErr != nil {
		st.Ring.LastError = d.lastErr.Error()
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

func (d *Daemon) statusJSON() ([]byte, error) { return json.Marshal(d.Status()) }
