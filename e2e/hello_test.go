package e2e

import (
	"bytes"
	"strings"
	"testing"

	"github.com/collectived/collectived/ipc"
)

// helloAs sends HELLO asking for local rank (-1: any) as pid and label.
func (r *rawClient) helloAs(rank int32, pid uint32, label string) {
	r.t.Helper()
	r.send(ipc.Hello{Version: ipc.Version, LocalRank: rank, PID: pid, Job: "e2e", Label: label}.Encode(1), -1)
}

// helloOK reads HELLO_OK.
func (r *rawClient) helloOK() ipc.HelloOK {
	r.t.Helper()
	typ, flags, p := r.read()
	if typ != ipc.TypeHelloOK {
		e, _ := ipc.DecodeError(flags, p)
		r.t.Fatalf("HELLO answered with %s: %v", typ, e)
	}
	ok, err := ipc.DecodeHelloOK(p)
	if err != nil {
		r.t.Fatal(err)
	}
	return ok
}

// TestHelloAgainstDaemon: a real daemon's HELLO_OK places the trainer in
// the world and states the configured limits; a local rank asked for
// explicitly or as "any free" is given once, and the refusals (taken,
// full, out of range) are fatal and say why. A rank freed by a closed
// connection is given again.
func TestHelloAgainstDaemon(t *testing.T) {
	// A first-call timeout unlike the collective one, to see which is which.
	w := startWorld(t, 2, 2, strings.Replace(fastTimeouts, "first_call: 20s", "first_call: 45s", 1))
	sock := w.sockets[1]

	first := dialRaw(t, sock)
	first.helloAs(1, 4242, "first")
	got := first.helloOK()
	want := ipc.HelloOK{Version: ipc.Version, WorldRank: 3, WorldSize: 4, NodeRank: 1, NodeCount: 2, LocalRank: 1, LocalSize: 2,
		InlineLimit: 64 << 10, MaxFrame: got.MaxFrame, MaxInFlight: 1024, Generation: got.Generation, ShmQuota: 4 << 30, TimeoutMS: 20000,
		FirstCallTimeoutMS: 45000}
	if got != want {
		t.Fatalf("HELLO_OK %+v\nwant      %+v", got, want)
	}
	if got.MaxFrame < got.InlineLimit+512 {
		t.Errorf("max_frame %d below inline_limit + 512", got.MaxFrame)
	}

	anyRank := dialRaw(t, sock)
	anyRank.helloAs(-1, 4343, "any")
	if ok := anyRank.helloOK(); ok.LocalRank != 0 || ok.WorldRank != 2 {
		t.Fatalf("HELLO for any rank got local %d world %d, want 0 and 2", ok.LocalRank, ok.WorldRank)
	}

	taken := dialRaw(t, sock)
	taken.helloAs(1, 99, "second")
	taken.expectError(ipc.CodeRankTaken, `local rank 1 of node 1 is held by pid 4242 ("first")`, true)
	full := dialRaw(t, sock)
	full.helloAs(-1, 99, "third")
	full.expectError(ipc.CodeFull, "all 2 local ranks of node 1 are taken", true)
	outside := dialRaw(t, sock)
	outside.helloAs(7, 99, "seventh")
	outside.expectError(ipc.CodeRankRange, "local rank 7 outside [0, 2) on node 1", true)

	// Clients of versions 1 and 2 get the 60 bytes they always got: the
	// version 3 answer without its first_call_timeout_ms, in their version.
	for v := uint16(ipc.MinVersion); v < 3; v++ {
		old := dialRaw(t, sock)
		old.send(ipc.Hello{Version: v, Observer: true, LocalRank: -1, PID: 1, Job: "e2e"}.Encode(1), -1)
		typ, _, p := old.read()
		obs := got
		obs.Version, obs.WorldRank, obs.LocalRank, obs.FirstCallTimeoutMS = v, ipc.NoRank, ipc.NoRank, 0
		if want := obs.Encode(1)[ipc.HeaderSize:]; typ != ipc.TypeHelloOK || len(p) != ipc.HelloOKSizeV1 || !bytes.Equal(p, want) {
			t.Errorf("version %d observer: %s %x\nwant HELLO_OK %x", v, typ, p, want)
		}
		old.uc.Close()
	}

	first.uc.Close()
	again := dialRaw(t, sock)
	again.helloAs(1, 4444, "again")
	if ok := again.helloOK(); ok.LocalRank != 1 { // read bounded by rawClient.read's 5 s
		t.Fatalf("HELLO for the freed rank: local %d", ok.LocalRank)
	}
}
