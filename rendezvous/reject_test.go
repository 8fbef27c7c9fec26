package rendezvous

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/collectived/collectived/internal/syncbuf"
)

// target is rank 1 of a world of three on 127.0.0.1; tests dial it as rank
// 0 (its prev) with one thing wrong.
type target struct {
	l       *Listener
	peers   []string
	addr    string
	rejects *rejectLog
}

func newTarget(t *testing.T, forming bool, tweak func(*Config)) *target {
	t.Helper()
	lns, peers := freeListeners(t, 3)
	lns[0].Close()
	t.Cleanup(func() { lns[2].Close() }) // next: answers TCP, never speaks
	cfg := testConfig(t, peers, 1, 1)
	rj := newRejectLog()
	cfg.OnReject = rj.hook
	if tweak != nil {
		tweak(&cfg)
	}
	l, err := NewListener(cfg, lns[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if forming {
		formInBackground(t, l)
	}
	return &target{l: l, peers: peers, addr: peers[1], rejects: rj}
}

// expect checks the dialer's error and the listener's OnReject report.
func (tg *target) expect(t *testing.T, dialErr, sentinel error, parts ...string) {
	t.Helper()
	wantErr(t, "dialer", dialErr, sentinel)
	rj := tg.rejects.waitFor(t, sentinel, 5*time.Second)
	wantErr(t, "listener", rj.err, sentinel, parts...)
	if !strings.HasPrefix(rj.addr, "127.0.0.") {
		t.Fatalf("rejection names %q, want the remote address", rj.addr)
	}
}

func TestRejectWrongTokenAtListener(t *testing.T) {
	tg := newTarget(t, true, nil)
	p := craft(t, tg.peers, 0)
	p.cfg.Token = []byte("another-token-0123456789abcdef")
	p.skipListenerProof = true // reach the listener's check of our proof
	_, err := dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrAuth, "dialer's proof does not match")
	wantErr(t, "dialer", err, ErrAuth, "refused us")
}

func TestRejectWrongTokenAtDialer(t *testing.T) {
	tg := newTarget(t, true, nil)
	p := craft(t, tg.peers, 0)
	p.cfg.Token = []byte("another-token-0123456789abcdef")
	_, err := dialCrafted(tg.addr, p)
	wantErr(t, "dialer", err, ErrAuth, "failed handshake", "listener's proof does not match")
	rj := tg.rejects.waitFor(t, ErrAuth, 5*time.Second)
	wantErr(t, "listener", rj.err, ErrAuth, "dialer refused us")
}

func TestRejectOtherJob(t *testing.T) {
	tg := newTarget(t, false, nil)
	p := craft(t, tg.peers, 0)
	p.hello.Job = "other-job"
	_, err := dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrJob, `peer "other-job", ours "test-job"`)
}

func TestRejectOtherWorldSize(t *testing.T) {
	tg := newTarget(t, false, nil)
	p := craft(t, tg.peers, 0)
	p.hello.World = 5
	_, err := dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrWorldSize, "peer 5, ours 3")
}

func TestRejectOtherDigest(t *testing.T) {
	tg := newTarget(t, false, nil)
	p := craft(t, tg.peers, 0)
	p.hello.Digest[0] ^= 0xff
	_, err := dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrDigest, "peer "+shortHex(p.hello.Digest), "ours "+shortHex(testDigest))
	wantErr(t, "dialer", err, ErrDigest, shortHex(p.hello.Digest), shortHex(testDigest))
}

func TestRejectOtherStreams(t *testing.T) {
	tg := newTarget(t, false, nil)
	p := craft(t, tg.peers, 0)
	p.hello.Streams = 4
	_, err := dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrStreams, "peer 4, ours 1")
}

func TestRejectOtherByteOrder(t *testing.T) {
	tg := newTarget(t, false, nil)
	p := craft(t, tg.peers, 0)
	p.hello.ByteOrder = [4]byte{nativeBOM[3], nativeBOM[2], nativeBOM[1], nativeBOM[0]}
	_, err := dialCrafted(tg.addr, p)
	ours := "little-endian"
	theirs := "big-endian"
	if nativeBOM[0] == 1 {
		ours, theirs = theirs, ours
	}
	tg.expect(t, err, ErrByteOrder, "peer "+theirs, "ours "+ours)

	p = craft(t, tg.peers, 0)
	p.hello.ByteOrder = [4]byte{9, 9, 9, 9}
	_, err = dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrByteOrder, "unknown marker 09 09 09 09")
}

func TestRejectUnexpectedRank(t *testing.T) {
	tg := newTarget(t, false, nil)
	p := craft(t, tg.peers, 2) // rank 2 is rank 1's next, never its prev
	p.wantRank = 1
	_, err := dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrUnexpectedRank, "peer says rank 2, our prev is rank 0")

	p = craft(t, tg.peers, 0)
	p.hello.Stream = 3
	_, err = dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrUnexpectedRank, "stream 3 from rank 0, streams per link 1")
}

// The dialer checks who answered: rank 1 is not the rank 2 it wanted.
func TestRejectUnexpectedRankAtDialer(t *testing.T) {
	tg := newTarget(t, true, nil)
	p := craft(t, tg.peers, 0)
	p.wantRank = 2
	_, err := dialCrafted(tg.addr, p)
	wantErr(t, "dialer", err, ErrUnexpectedRank, "peer says rank 1, our next is rank 2")
	rj := tg.rejects.waitFor(t, ErrUnexpectedRank, 5*time.Second)
	wantErr(t, "listener", rj.err, ErrUnexpectedRank, "dialer refused us")
}

// A connection from an address in no peer's entry is refused as such.
func TestRejectAddrNotInPeers(t *testing.T) {
	tg := newTarget(t, true, nil)
	p := craft(t, tg.peers, 0)
	p.local = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)}
	_, err := dialCrafted(tg.addr, p)
	if err != nil && strings.Contains(err.Error(), "bind") {
		t.Skipf("cannot dial from 127.0.0.3: %v", err)
	}
	tg.expect(t, err, ErrAddrNotInPeers, "connection from 127.0.0.3", "prev is rank 0 (127.0.0.1:")
	wantErr(t, "dialer", err, ErrAddrNotInPeers, "is not from our prev peer")
}

// A listed peer that is not our prev is named as such, not as a stranger
// (issue 29): rank 1's prev lives at 127.0.0.2 (also loopback), and we
// dial from 127.0.0.1, rank 2's address.
func TestRejectNotPrev(t *testing.T) {
	tg := newTarget(t, true, func(c *Config) {
		_, port, _ := net.SplitHostPort(c.Peers[0])
		c.Peers[0] = net.JoinHostPort("127.0.0.2", port)
	})
	p := craft(t, tg.peers, 0)
	_, err := dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrNotPrev, "connection from 127.0.0.1, the address of rank 1", "prev is rank 0 (127.0.0.2:")
	wantErr(t, "dialer", err, ErrNotPrev, "is not from our prev peer")
	if errors.Is(err, ErrAddrNotInPeers) {
		t.Fatalf("a listed peer was told its address is not in the peer list: %v", err)
	}
	if strings.Contains(err.Error(), "127.0.0.2") {
		t.Fatalf("dialer learned where the real prev lives: %v", err)
	}
	if !fatal(err) {
		t.Fatalf("%v does not end Form; the peer list itself is wrong", err)
	}
}

func TestRejectOtherVersion(t *testing.T) {
	tg := newTarget(t, false, nil)
	p := craft(t, tg.peers, 0)
	frame := appendHello(nil, &p.hello)
	frame[4] = ProtocolVersion + 1
	c, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(frame)
	tg.expect(t, readStatus(t, c), ErrVersion, fmt.Sprintf("peer %d, ours %d", ProtocolVersion+1, ProtocolVersion))
}

// The dialer names a listener of another version, whatever it says next.
func TestRejectOtherVersionAtDialer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var buf frameBuf
		readFrame(c, &buf)
		reply := appendStatus(nil, codeVersion, "speaks another version")
		reply[4] = ProtocolVersion + 1
		c.Write(reply)
	}()
	p := craft(t, []string{"127.0.0.1:1", ln.Addr().String()}, 0)
	_, err = dialCrafted(ln.Addr().String(), p)
	wantErr(t, "dialer", err, ErrVersion, fmt.Sprintf("peer %d, ours %d", ProtocolVersion+1, ProtocolVersion))
}

func TestRejectGarbage(t *testing.T) {
	tg := newTarget(t, false, nil)
	c, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	rj := tg.rejects.waitFor(t, ErrBadMagic, 5*time.Second)
	wantErr(t, "listener", rj.err, ErrBadMagic, "47 45 54 20") // "GET "
	expectClosed(t, c)
}

// Every refusal is logged with the remote address and the reason.
func TestRejectIsLogged(t *testing.T) {
	var logs syncbuf.Buffer
	tg := newTarget(t, false, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	c, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("garbage!"))
	tg.rejects.waitFor(t, ErrBadMagic, 5*time.Second)
	out := logs.String()
	for _, want := range []string{"level=WARN", `msg="rendezvous refused connection"`, "remote=" + c.LocalAddr().String(), "bad magic"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q:\n%s", want, out)
		}
	}
}

// A length beyond the limit is refused before anything is read or
// allocated for it.
func TestRejectOversizeFrame(t *testing.T) {
	tg := newTarget(t, false, nil)
	c, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(binary.BigEndian.AppendUint16(append([]byte(magic), ProtocolVersion, byte(frameHello)), 0xffff))
	rj := tg.rejects.waitFor(t, ErrMalformed, 5*time.Second)
	wantErr(t, "listener", rj.err, ErrMalformed, "65535 bytes exceeds limit 512")
	expectClosed(t, c)
}

func TestRejectHalfOpen(t *testing.T) {
	tg := newTarget(t, false, func(c *Config) { c.HandshakeTimeout = 300 * time.Millisecond })
	silent, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	slow, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slow.Write([]byte(magic)) // half a header, then nothing: slowloris
	for range 2 {
		rj := tg.rejects.waitFor(t, ErrHandshakeTimeout, 5*time.Second)
		wantErr(t, "listener", rj.err, os.ErrDeadlineExceeded, "within 300ms while reading hello")
	}
	expectClosed(t, silent)
	expectClosed(t, slow)
}

// waitWaiting waits until the listener holds n unauthenticated
// handshakes from prev's address and strangers from other addresses.
func waitWaiting(t *testing.T, l *Listener, n, strangers int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		w, s := len(l.waiting), l.strangers
		l.mu.Unlock()
		if w == n && s == strangers {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("listener holds %d handshakes from prev's address and %d from strangers, want %d and %d", w, s, n, strangers)
		}
		time.Sleep(time.Millisecond)
	}
}

// Strangers (not from prev's address) get MaxPending/8 slots; more are
// refused at once, and however many they hold, prev gets in.
func TestRejectBusyStrangersLeavePrevRoom(t *testing.T) {
	tg := newTarget(t, true, func(c *Config) { c.MaxPending = 16; c.HandshakeTimeout = 3 * time.Second })
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 5)}}
	for range 2 {
		c, err := d.Dial("tcp", tg.addr)
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.5: %v", err)
		}
		defer c.Close()
	}
	waitWaiting(t, tg.l, 0, 2)
	c, err := d.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tg.expect(t, readStatus(t, c), ErrBusy, "other than our prev peer's, limit 2")
	if _, err := dialCrafted(tg.addr, craft(t, tg.peers, 0)); err != nil {
		t.Fatalf("prev kept out by strangers: %v", err)
	}
}

// From prev's address a new connection always gets a slot: with all
// MaxPending held, the oldest unauthenticated one is evicted (told busy,
// and closed), and a genuine handshake completes.
func TestEvictOldestUnauthenticated(t *testing.T) {
	tg := newTarget(t, true, func(c *Config) { c.MaxPending = 2; c.HandshakeTimeout = 3 * time.Second })
	var held []net.Conn
	for i := range 2 {
		c, err := net.Dial("tcp", tg.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
		waitWaiting(t, tg.l, i+1, 0)
	}
	// A third: the oldest goes.
	third, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	tg.expect(t, readStatus(t, held[0]), ErrBusy, "evicted, the oldest of 2 unauthenticated handshakes")
	expectClosed(t, held[0])
	waitWaiting(t, tg.l, 2, 0)
	// The genuine prev, while two half-open connections are held: it
	// evicts the older, and its proven stream frees its own slot.
	c, err := dialCrafted(tg.addr, craft(t, tg.peers, 0))
	if err != nil {
		t.Fatalf("prev kept out by held slots: %v", err)
	}
	c.Close()
	tg.expect(t, readStatus(t, held[1]), ErrBusy, "evicted")
	waitWaiting(t, tg.l, 1, 0) // third alone
}

// A Form completes while an attacker on prev's own address keeps more
// unauthenticated handshakes open than there are slots, half of them with
// a hello that passes every check but the proof, each replaced the moment
// it ends (issue 29: before, it held every slot and prev never got one).
func TestFormWhileSlotsHeld(t *testing.T) {
	const streams = 2
	w := newWorld(t, 2, streams, func(c *Config) { c.MaxPending = 8; c.HandshakeTimeout = 2 * time.Second })
	stop := make(chan struct{})
	var attackers sync.WaitGroup
	defer func() { close(stop); attackers.Wait() }()
	for i := range 24 {
		attackers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", w.peers[1])
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				if i%2 == 0 {
					p := craft(t, w.peers, 0)
					p.cfg.Streams, p.hello.Streams = streams, streams
					rand.Read(p.hello.Nonce[:])
					c.Write(appendHello(nil, &p.hello))
				}
				go func() { <-stop; c.Close() }()
				io.Copy(io.Discard, c)
				c.Close()
			}
		})
	}
	time.Sleep(100 * time.Millisecond) // let them fill the slots
	links := mustFormAll(t, w.ls, []uint32{1, 1})
	checkWired(t, w.peers, links, []uint32{1, 1}, streams)
	w.rejects[1].waitFor(t, ErrBusy, 5*time.Second)
}

func TestRejectNotForming(t *testing.T) {
	tg := newTarget(t, false, nil)
	p := craft(t, tg.peers, 0)
	_, err := dialCrafted(tg.addr, p)
	tg.expect(t, err, ErrNotForming, "rank 1 is not in Form")
	if fatal(err) {
		t.Fatalf("%v ends Form; it should be retried", err)
	}
}

// A handshake recorded off the wire and played back is refused by name.
func TestRejectReplay(t *testing.T) {
	tg := newTarget(t, true, nil)
	p := craft(t, tg.peers, 0)
	rec := &recorder{}
	ctxConn, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	rec.Conn = ctxConn
	ctxConn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := dialHandshake(rec, p); err != nil {
		t.Fatalf("genuine handshake: %v", err)
	}
	defer ctxConn.Close()

	c, err := net.Dial("tcp", tg.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(rec.sent.Bytes())
	tg.expect(t, readStatus(t, c), ErrReplay, "was seen before")
}

// recorder keeps every byte written through it.
type recorder struct {
	net.Conn
	sent bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) {
	r.sent.Write(b)
	return r.Conn.Write(b)
}

// readStatus reads the listener's answer to a raw dial and returns the
// error it carries (nil for OK).
func readStatus(t *testing.T, c net.Conn) error {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf frameBuf
	f, err := readFrame(c, &buf)
	if err != nil {
		t.Fatalf("reading the listener's status: %v", err)
	}
	if f.typ != frameStatus {
		t.Fatalf("listener answered with a %v frame, want status", f.typ)
	}
	return decodeStatus(f.payload)
}

func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 64))
	if n != 0 || (err != io.EOF && !errors.Is(err, os.ErrClosed) && !isReset(err)) {
		t.Fatalf("read %d bytes, %v; want the listener to close without answering", n, err)
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// A flood of refused connections from one address costs a few log lines,
// not one each, and every one is counted by reason and source (issue 29).
func TestRejectLogsRateLimited(t *testing.T) {
	var buf syncbuf.Buffer
	tg := newTarget(t, false, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&buf, nil)) })
	const n = 200
	for range n {
		c, err := net.Dial("tcp", tg.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.Copy(io.Discard, c)
		c.Close()
	}
	for range n {
		tg.rejects.waitFor(t, ErrBadMagic, 5*time.Second)
	}
	lines := strings.Count(buf.String(), "rendezvous refused connection")
	if lines != 5 { // logthrottle.DefaultBurst
		t.Fatalf("%d refusals logged %d lines in full, want 5:\n%s", n, lines, buf.String())
	}
	c := tg.l.Refusals()
	if c.Total != n || c.Reasons[ErrBadMagic.Error()] != n || len(c.Sources) != 1 || c.Sources[0].Source != "127.0.0.1" {
		t.Fatalf("counts %+v, want %d bad magic from 127.0.0.1", c, n)
	}
	tg.l.Close()
	if !strings.Contains(buf.String(), `msg="rendezvous: 200 connections refused from 127.0.0.1 in the last 10s: not a collectived rendezvous handshake (bad magic)"`) {
		t.Fatalf("no summary when the listener closed:\n%s", buf.String())
	}
}
