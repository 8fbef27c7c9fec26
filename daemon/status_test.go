package daemon

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/config"
	"github.com/collectived/collectived/internal/logthrottle"
	"github.com/collectived/collectived/ipc"
)

// worstDesc is the longest description a call can render: the longest
// name of characters Go quotes as \xNN (which JSON then escapes again),
// every optional field at its widest.
func worstDesc() collective.Desc {
	d := collective.Desc{Op: collective.OpAllGather, DType: collective.BFloat16, Reduce: collective.Sum,
		Count: math.MaxUint64, Root: math.MaxUint32, PreScale: -math.SmallestNonzeroFloat64, PostScale: -math.MaxFloat64,
		Name: strings.Repeat("\x01", ipc.MaxStringLen)}
	d.Shape.N = collective.MaxDims
	for i := range d.Shape.Dims {
		d.Shape.Dims[i] = math.MaxUint64
	}
	for range 4096 {
		d.Counts = append(d.Counts, math.MaxUint64)
	}
	return d
}

// worstCounts is a throttle's counts with every reason and the most
// sources it keeps, at their longest.
func worstCounts(reasons []string, source func(i int) string) logthrottle.Counts {
	c := logthrottle.Counts{Total: math.MaxUint64, Reasons: map[string]uint64{}}
	for _, r := range reasons {
		c.Reasons[r] = math.MaxUint64
	}
	for i := range logthrottle.DefaultMaxSources + len(reasons) {
		c.Sources = append(c.Sources, logthrottle.SourceCount{Source: source(i), Reason: reasons[i%len(reasons)],
			Count: math.MaxUint64, Last: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("x", -12*3600))})
	}
	return c
}

// The STATUS_OK document stays within ipc.MaxStatusFrame at the largest
// legal configuration, every string at its longest and worst to escape:
// 1024 local ranks, each attached with a 255-byte label of control
// characters (6 bytes each in JSON) and a last call with the longest
// description; 4096 peers with 253-byte host names; an error of 4 KiB
// and more; every refusal reason from the most sources counted. Nothing
// is left out (Truncated), and a document over the bound is cut down
// rather than refused.
func TestStatusDocumentAtTheMaxima(t *testing.T) {
	host := strings.Repeat("h", 253)
	var peers []string
	for i := range config.MaxPeers {
		peers = append(peers, fmt.Sprintf("%s:%d", host[:253-5]+fmt.Sprintf("%05d", i), 65535))
	}
	ctl := strings.Repeat("\x01", ipc.MaxStringLen)
	desc := worstDesc().String()
	st := Status{
		Job: strings.Repeat(`"`, 255), NodeRank: math.MaxInt32, NodeCount: config.MaxPeers, LocalSize: config.MaxLocalSize,
		Socket: strings.Repeat(`"`, config.MaxSocketPath), Listen: peers[0], Peers: peers,
		Ring: RingStatus{State: "forming", Generation: math.MaxUint32, Finished: math.MaxUint64, Next: peers[1], Prev: peers[2],
			LastError: clip(strings.Repeat("\x01", 100000), maxStatusError), Op: "allgather seq 18446744073709551615",
			Step: math.MaxInt32, HeardFromNextSec: -math.MaxFloat64, HeardFromPrevSec: -math.MaxFloat64, BufferBytes: math.MaxInt64},
		Process: ProcessStatus{PID: math.MaxInt32, Goroutines: math.MaxInt64, FDs: math.MaxInt64, Memfds: math.MaxInt64,
			FDLimit: math.MaxUint64, RSSBytes: math.MaxInt64, Mallocs: math.MaxUint64, HeapBytes: math.MaxUint64},
		ReportedAt: time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
	}
	for l := range config.MaxLocalSize {
		st.Trainers = append(st.Trainers, TrainerStatus{LocalRank: l, WorldRank: math.MaxInt32, Attached: true, PID: math.MinInt32,
			Label: ctl, Calls: math.MaxUint64, LastCall: desc, Queued: math.MaxInt64, Owes: math.MaxInt64, Lane: true})
	}
	d := &Daemon{cfg: Config{Rank: config.MaxPeers - 1, LocalSize: config.MaxLocalSize}, slots: make([]slot, config.MaxLocalSize),
		match: newMatcher[*ipc.Request](config.MaxLocalSize)}
	st.InFlight = &InFlightStatus{Seq: math.MaxUint64, Phase: phaseLocal, Call: desc, WaitedSec: -math.MaxFloat64,
		NotCalled: d.missingLocked()}
	var ringReasons, socketReasons []string
	for _, r := range []string{"not a collectived rendezvous handshake (bad magic)", "malformed handshake", "other protocol version",
		"other byte order", "other job", "other world size", "other job shape digest", "other streams per link",
		"authentication failed", "unexpected rank", "address not in peer list", "address of a peer that is not our prev",
		"replayed handshake", "handshake timed out", "too many handshakes pending", "not forming a ring now",
		"stale formation attempt", "closed mid-handshake", "connection error mid-handshake"} {
		ringReasons = append(ringReasons, r)
	}
	for c := ipc.Code(1); c <= 22; c++ {
		socketReasons = append(socketReasons, c.String())
	}
	socketReasons = append(socketReasons, "credentials unreadable")
	st.Refused.Ring = worstCounts(ringReasons, func(i int) string { return fmt.Sprintf("fe80::ffff:ffff:ffff:%04x%%%s", i, strings.Repeat("e", 15)) })
	st.Refused.Socket = worstCounts(socketReasons, func(i int) string { return fmt.Sprintf("uid %d", math.MaxUint32-i) })

	doc, err := encodeStatus(st)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the document at the maxima is %d bytes (bound %d); %d of them the trainers, %d the peers", len(doc), ipc.MaxStatusFrame,
		jsonLen(t, st.Trainers), jsonLen(t, st.Peers))
	if len(doc) > ipc.MaxStatusFrame {
		t.Fatalf("the document at the maxima is %d bytes, over the STATUS_OK bound of %d", len(doc), ipc.MaxStatusFrame)
	}
	var back Status
	if err := json.Unmarshal(doc, &back); err != nil {
		t.Fatal(err)
	}
	if back.Truncated != "" || len(back.Trainers) != config.MaxLocalSize || back.Trainers[1023].Label != ctl ||
		back.Trainers[0].LastCall != desc || len(back.Peers) != config.MaxPeers {
		t.Fatalf("the document at the maxima lost something: truncated %q, %d trainers, %d peers", back.Truncated, len(back.Trainers), len(back.Peers))
	}

	// Past the bound (not a legal configuration: peers 16 times as long),
	// the document is cut down and says so.
	for i := range st.Peers {
		st.Peers[i] = strings.Repeat(st.Peers[i], 16)
	}
	doc, err = encodeStatus(st)
	if err != nil {
		t.Fatal(err)
	}
	back = Status{}
	if err := json.Unmarshal(doc, &back); err != nil {
		t.Fatal(err)
	}
	if len(doc) > ipc.MaxStatusFrame || !strings.Contains(back.Truncated, "over the 8388608-byte bound") || back.Peers != nil ||
		back.Trainers[5].Label != "" || len(back.Trainers) != config.MaxLocalSize {
		t.Fatalf("an oversized document: %d bytes, truncated %q", len(doc), back.Truncated)
	}
}

func jsonLen(t *testing.T, v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return len(b)
}

func TestClip(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"0123456789", 10, "0123456789"},
		{"0123456789abc", 10, "0123456…"},
		{"012345é789abc", 10, "012345…"}, // never half a rune
	} {
		if got := clip(tc.s, tc.n); got != tc.want || len(got) > tc.n {
			t.Errorf("clip(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}
