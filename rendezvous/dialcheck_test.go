package rendezvous

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"
)

// fakeListener accepts one connection on ln and answers the dialer's hello
// as a listener would, with the hello spoil makes and a valid proof over
// it, so that only the dialer's own checks can refuse it. It reports the
// status frame the dialer sends back (nil error for OK).
func fakeListener(t *testing.T, ln net.Listener, spoil func(*hello)) <-chan error {
	t.Helper()
	verdict := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			verdict <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		var buf frameBuf
		f, err := readFrame(c, &buf)
		if err != nil {
			verdict <- err
			return
		}
		dh, err := decodeHello(f.payload)
		if err != nil {
			verdict <- err
			return
		}
		dialerRaw := bytes.Clone(f.raw)
		lh := hello{ByteOrder: nativeBOM, Rank: 1, World: 2, Streams: 1, Stream: dh.Stream,
			Session: session{Epoch: 1, Seq: 1}, Digest: testDigest, Job: "test-job"}
		lh.Nonce[0] = 7
		spoil(&lh)
		listenerRaw := appendHello(nil, &lh)
		c.Write(appendAuth(bytes.Clone(listenerRaw), proof(testToken, labelListener, dialerRaw, listenerRaw)))
		f, err = readFrame(c, &buf)
		if err != nil {
			verdict <- err
			return
		}
		if f.typ != frameStatus {
			verdict <- errors.New("dialer answered with a " + f.typ.String() + " frame")
			return
		}
		verdict <- decodeStatus(f.payload)
	}()
	return verdict
}

// The dialer checks the listener's hello as the listener checks the
// dialer's: a next that answers for another job, world, shape, byte order,
// stream count or stream is refused by name, although its proof is valid,
// and the listener is told why in a status frame.
func TestDialerChecksListenerHello(t *testing.T) {
	cases := []struct {
		name     string
		spoil    func(*hello)
		sentinel error
		text     string
	}{
		{"job", func(h *hello) { h.Job = "other-job" }, ErrJob, `peer "other-job", ours "test-job"`},
		{"world", func(h *hello) { h.World = 3 }, ErrWorldSize, "peer 3, ours 2"},
		{"digest", func(h *hello) { h.Digest[5] ^= 1 }, ErrDigest, "ours " + shortHex(testDigest)},
		{"byte order", func(h *hello) { h.ByteOrder = [4]byte{9, 9, 9, 9} }, ErrByteOrder, "unknown marker 09 09 09 09"},
		{"streams", func(h *hello) { h.Streams = 2 }, ErrStreams, "peer 2, ours 1"},
		{"stream", func(h *hello) { h.Stream = 1; h.Streams = 1 }, ErrUnexpectedRank, "stream 1 from rank 1, streams per link 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			verdict := fakeListener(t, ln, c.spoil)
			p := craft(t, []string{"127.0.0.1:1", ln.Addr().String()}, 0)
			_, err = dialCrafted(ln.Addr().String(), p)
			wantErr(t, "dialer", err, c.sentinel, "failed handshake", c.text)
			if !fatal(err) {
				t.Errorf("%v would be retried; a misconfigured next must end Form at once", err)
			}
			select {
			case v := <-verdict:
				wantErr(t, "listener's view", v, c.sentinel, c.text)
			case <-time.After(10 * time.Second):
				t.Fatal("the fake listener heard nothing back")
			}
		})
	}
}

// The job token never crosses the wire: neither side of a genuine
// handshake sends it, in any frame.
func TestTokenNeverSent(t *testing.T) {
	tg := newTarget(t, true, nil)
	p := craft(t, tg.peers, 0)
	c, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rec := &recordBoth{recorder: recorder{Conn: c}}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := dialHandshake(rec, p); err != nil {
		t.Fatalf("genuine handshake: %v", err)
	}
	for dir, b := range map[string][]byte{"dialer to listener": rec.sent.Bytes(), "listener to dialer": rec.got.Bytes()} {
		if len(b) == 0 {
			t.Fatalf("%s: nothing recorded", dir)
		}
		if bytes.Contains(b, testToken) || bytes.Contains(b, testToken[:MinToken]) {
			t.Errorf("%s: the job token is on the wire", dir)
		}
	}
}

// recordBoth keeps every byte read as well as written.
type recordBoth struct {
	recorder
	got bytes.Buffer
}

func (r *recordBoth) Read(b []byte) (int, error) {
	n, err := r.Conn.Read(b)
	r.got.Write(b[:n])
	return n, err
}

func (r *recordBoth) Write(b []byte) (int, error) { return r.recorder.Write(b) }

// A node may bind every interface and still advertise one address: its
// peers dial the advertised address, it dials them from it (so its next's
// check of the prev address passes), and the ring forms.
func TestListenAllInterfacesAdvertiseOne(t *testing.T) {
	lns, peers := freeListeners(t, 2)
	_, port, _ := net.SplitHostPort(peers[0])
	lns[0].Close() // rank 0 binds its port itself, on every interface
	ls := make([]*Listener, 2)
	for r := range 2 {
		cfg := testConfig(t, peers, r, 2)
		var l *Listener
		var err error
		if r == 0 {
			cfg.Listen = "0.0.0.0:" + port
			l, err = Listen(cfg)
		} else {
			l, err = NewListener(cfg, lns[r])
		}
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls[r] = l
	}
	if a := ls[0].Addr().(*net.TCPAddr); !a.IP.IsUnspecified() || strconv.Itoa(a.Port) != port {
		t.Fatalf("rank 0 bound %v, want 0.0.0.0:%s", a, port)
	}
	links, errs := formAll(ls, []uint32{1, 1})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	defer func() {
		for _, k := range links {
			k.Close()
		}
	}()
	checkWired(t, peers, links, []uint32{1, 1}, 2)
	for _, c := range links[0].Next {
		if got := c.LocalAddr().(*net.TCPAddr).IP.String(); got != "127.0.0.1" {
			t.Fatalf("rank 0 dialled from %s, want its advertised 127.0.0.1", got)
		}
	}
}

// A recorded handshake played to a listener that never saw its nonce (here
// another listener; in life, one whose nonce cache has since evicted it)
// still fails: the dialer's proof covers the listener's fresh nonce, which
// the recording cannot have.
func TestReplayWithForgottenNonceFailsAuth(t *testing.T) {
	first := newTarget(t, true, nil)
	c, err := net.Dial("tcp", first.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rec := &recorder{Conn: c}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := dialHandshake(rec, craft(t, first.peers, 0)); err != nil {
		t.Fatalf("genuine handshake: %v", err)
	}

	other := newTarget(t, true, nil)
	r, err := net.Dial("tcp", other.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Write(rec.sent.Bytes())
	r.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf frameBuf
	for _, want := range []frameType{frameHello, frameAuth, frameStatus} {
		f, err := readFrame(r, &buf)
		if err != nil || f.typ != want {
			t.Fatalf("listener's answer: %v frame, %v; want %v", f.typ, err, want)
		}
		if want == frameStatus {
			wantErr(t, "replayer", decodeStatus(f.payload), ErrAuth, "dialer's proof does not match")
		}
	}
	rj := other.rejects.waitFor(t, ErrAuth, 5*time.Second)
	wantErr(t, "listener", rj.err, ErrAuth, "dialer's proof does not match")
}

// Listen in a world of one binds nothing: its own address may even be
// taken by another socket, and Form still returns empty links at once.
func TestListenWorldOfOneOpensNoSocket(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	l, err := Listen(testConfig(t, []string{held.Addr().String()}, 0, 2))
	if err != nil {
		t.Fatalf("world of one tried to bind: %v", err)
	}
	defer l.Close()
	if l.Addr() != nil {
		t.Fatalf("world of one bound %v", l.Addr())
	}
	k, err := l.Form(context.Background(), 3)
	if err != nil || k.Next != nil || k.Prev != nil || k.NextGeneration != 3 || k.PrevGeneration != 3 {
		t.Fatalf("world of one: %+v, %v", k, err)
	}
}
