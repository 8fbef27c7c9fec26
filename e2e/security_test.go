package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/config"
	"github.com/collectived/collectived/ipc"
)

// The security tests attack a running world on loopback: strangers on the
// ring port (garbage, other versions, jobs, worlds and configs, replays,
// a wrong token, oversized lengths, slowloris), a man in the middle of an
// authenticated link sending a frame header that claims 3 GiB, and
// clients abusing fd passing on the Unix socket. Every attack must be
// refused and logged with its reason and remote address, and the
// trainers' allreduces must go on unaffected.

// Rendezvous handshake bytes, as rendezvous/doc.go draws them. They are
// written out here, not borrowed from the package, so that the test
// checks the documented layout.
const (
	rvHeaderLen   = 8
	rvVersion     = 5 // rendezvous.ProtocolVersion
	rvHello       = 1
	rvAuth        = 2
	rvStatus      = 3
	rvDialerLabel = "collectived rendezvous v1: dialer proof\x00"
	rvListenLabel = "collectived rendezvous v1: listener proof\x00"
)

// Reject codes of a status frame (rendezvous/errors.go; wire values).
const (
	rvCodeMalformed  = 1
	rvCodeVersion    = 2
	rvCodeByteOrder  = 3
	rvCodeJob        = 4
	rvCodeWorld      = 5
	rvCodeDigest     = 6
	rvCodeAuth       = 8
	rvCodeReplay     = 11
	rvCodeBusy       = 12
	rvCodeNotForming = 13
)

// rvHelloMsg is a dialer's hello.
type rvHelloMsg struct {
	version       byte
	rank, world   uint32
	streams, strm uint16
	digest        [32]byte
	nonce         [32]byte
	job           string
	swapBOM       bool // claim the other byte order
}

func (h rvHelloMsg) frame() []byte {
	p := make([]byte, 0, 101+len(h.job))
	if h.swapBOM {
		p = binary.NativeEndian.AppendUint32(p, 0x04030201)
	} else {
		p = binary.NativeEndian.AppendUint32(p, 0x01020304) // byte order marker
	}
	p = binary.BigEndian.AppendUint32(p, h.rank)
	p = binary.BigEndian.AppendUint32(p, h.world)
	p = binary.BigEndian.AppendUint16(p, h.streams)
	p = binary.BigEndian.AppendUint16(p, h.strm)
	p = binary.BigEndian.AppendUint32(p, 0) // generation proposal
	p = binary.BigEndian.AppendUint64(p, uint64(time.Now().UnixNano()))
	p = binary.BigEndian.AppendUint64(p, 1) // attempt
	p = append(p, h.digest[:]...)
	p = append(p, h.nonce[:]...)
	p = append(p, byte(len(h.job)))
	p = append(p, h.job...)
	return rvFrame(h.version, rvHello, p)
}

// ringHeaderClaiming is a ring data frame header (ring/doc.go) from rank 0
// claiming n payload bytes, with a header checksum that matches.
func ringHeaderClaiming(n uint32) []byte {
	h := make([]byte, ringHeaderLen)
	copy(h, "CRNG")
	h[4], h[5] = 2, 1 // version, data
	binary.LittleEndian.PutUint32(h[52:], n)
	sealRingHeader(h)
	return h
}

func rvFrame(version, typ byte, payload []byte) []byte {
	b := append([]byte("CLVD"), version, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	return append(b, payload...)
}

// readRV reads one handshake frame, whole, as sent.
func readRV(c net.Conn, d time.Duration) (typ byte, payload, raw []byte, err error) {
	c.SetReadDeadline(time.Now().Add(d))
	var h [rvHeaderLen]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, nil, nil, err
	}
	if string(h[:4]) != "CLVD" {
		return 0, nil, nil, fmt.Errorf("answer starts % x", h[:])
	}
	p := make([]byte, binary.BigEndian.Uint16(h[6:]))
	if _, err := io.ReadFull(c, p); err != nil {
		return 0, nil, nil, err
	}
	return h[5], p, append(h[:], p...), nil
}

// expectClosed reads until the daemon closes c, failing if it sends
// anything or keeps it open beyond d.
func expectClosed(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	var b [64]byte
	n, err := c.Read(b[:])
	if n > 0 {
		t.Fatalf("daemon answered % x, want the connection closed", b[:n])
	}
	if !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("connection not closed within %v: %v", d, err)
	}
}

func isReset(err error) bool { return errors.Is(err, unix.ECONNRESET) }

// expectStatus reads a status frame refusing us with code and then the
// connection's end.
func expectStatus(t *testing.T, c net.Conn, code byte, want string) {
	t.Helper()
	typ, p, _, err := readRV(c, 5*time.Second)
	if err != nil {
		t.Fatalf("reading the daemon's answer: %v", err)
	}
	if typ != rvStatus || len(p) == 0 || p[0] != code || !strings.Contains(string(p[1:]), want) {
		t.Fatalf("answer type %d payload %q, want status code %d saying %q", typ, p, code, want)
	}
}

// expectLogged waits until node i's log has a refusal line naming both
// the remote address and the reason.
func (c *cluster) expectLogged(i int, remote, reason string) {
	c.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, line := range strings.Split(c.fullLog(i), "\n") {
			if strings.Contains(line, "remote="+remote) && strings.Contains(line, reason) {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("daemon %d never logged a refusal of %s saying %q; log:\n%s", i, remote, reason, c.log(i))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expectLoggedAny waits until node i's log has a refusal line naming the
// remote address of one of conns and the reason: of many refusals from
// one address for one reason, only the first few are logged in full.
func (c *cluster) expectLoggedAny(i int, conns []net.Conn, reason string) {
	c.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, line := range strings.Split(c.fullLog(i), "\n") {
			if !strings.Contains(line, reason) {
				continue
			}
			for _, conn := range conns {
				if strings.Contains(line, "remote="+conn.LocalAddr().String()+" ") {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("daemon %d never logged a refusal of any of %d connections saying %q; log:\n%s", i, len(conns), reason, c.log(i))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// validHello is what rank r's daemon would send to its next, with a fresh
// nonce.
func (c *cluster) validHello(rank int) rvHelloMsg {
	cfg, err := config.Load(c.cfgPath)
	if err != nil {
		c.t.Fatal(err)
	}
	h := rvHelloMsg{version: rvVersion, rank: uint32(rank), world: uint32(c.nodes), streams: uint16(cfg.Ring.Streams), digest: cfg.ShapeDigest(), job: "e2e"}
	rand.Read(h.nonce[:])
	return h
}

// loopUntilStopped starts a looping faulttrainer per local rank and node;
// stopLoop ends them all at the same call.
func (c *cluster) loopUntilStopped(count string) (trs []*ftProc, stopFile string) {
	stopFile = filepath.Join(c.dir, "stop")
	for n := 0; n < c.nodes; n++ {
		for l := 0; l < c.local; l++ {
			trs = append(trs, c.startFT(n, "-mode", "loop", "-count", count, "-stop-file", stopFile, "-max-fails", "1"))
		}
	}
	waitFor(c.t, 60*time.Second, "every trainer to complete 2 calls", func() bool {
		for _, p := range trs {
			if len(p.events()) < 2 {
				return false
			}
		}
		return true
	})
	return trs, stopFile
}

// stopLoop stops the trainers a few calls ahead of the latest (they are
// in step) and checks that every call of every trainer succeeded, in the
// generation they began in, with the last ending after since.
func (c *cluster) stopLoop(trs []*ftProc, stopFile string, since time.Time) {
	c.t.Helper()
	// The trainers make a call every few milliseconds: aim well ahead of
	// the latest call, and check afterwards that none had got there yet.
	latest := func() int {
		last := 0
		for _, p := range trs {
			last = max(last, p.lastCall())
		}
		return last
	}
	stopAt := latest() + 100
	// Written whole, then renamed: a trainer must never read it half written.
	if err := os.WriteFile(stopFile+".tmp", []byte(strconv.Itoa(stopAt)), 0o600); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(stopFile+".tmp", stopFile); err != nil {
		c.t.Fatal(err)
	}
	if now := latest(); now+2 >= stopAt {
		c.t.Fatalf("the trainers reached call %d before the stop file (at call %d) was in place: raise the margin", now, stopAt)
	}
	for i, p := range trs {
		evs, err := p.wait(60 * time.Second)
		if err != nil {
			c.t.Fatalf("trainer %d: %v", i, err)
		}
		for _, e := range evs {
			if !e.OK {
				c.t.Fatalf("trainer %d call %d failed during the attacks: %s %s", i, e.Call, e.Code, e.Message)
			}
			if e.Gen != evs[0].Gen {
				c.t.Fatalf("trainer %d: the ring re-formed during the attacks (generation %d, then %d)", i, evs[0].Gen, e.Gen)
			}
		}
		if end := evs[len(evs)-1].end(); end.Before(since) {
			c.t.Fatalf("trainer %d stopped calling at %v, before the attacks ended at %v", i, end, since)
		}
		if i == 0 {
			c.t.Logf("trainer 0 made %d exact 1 MiB allreduces, all in generation %d, while under attack", len(evs), evs[0].Gen)
		}
	}
}

// TestRingPortStrangersDuringAllReduce: while a 2x1 world loops on 1 MiB
// allreduces, strangers connect to node 1's ring port with garbage, an
// over-long length, a ring frame header claiming 3 GiB without any
// handshake, another byte order, version, job, world size and shape
// digest, a truncated hello, a well-formed hello (refused before any proof
// is looked at: the ring is not forming) and the same hello replayed. Each is refused, with a status frame naming the reason where
// the protocol has one, and logged with the reason and the remote address.
// Then 68 half-open connections from node 0's address: 64 fill prev's
// handshake slots and are dropped at the handshake timeout; each of the
// last 4 evicts the oldest, which is told busy at once.
// No trainer call fails and the ring never re-forms.
func TestRingPortStrangersDuringAllReduce(t *testing.T) {
	c := newLoopCluster(t, 2, 1)
	c.startAll()
	bs := c.fleet().baselines()
	trs, stopFile := c.loopUntilStopped(loopCount)
	port := c.addrs[1]
	bad := func(mut func(*rvHelloMsg)) []byte {
		h := c.validHello(0)
		mut(&h)
		return h.frame()
	}
	replay := c.validHello(0).frame()
	for _, a := range []struct {
		name   string
		send   []byte
		code   int // -1: no answer, just closed
		answer string
		logged string
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: collectived\r\n\r\n"), -1, "", "bad magic"},
		{"over-long length", rvFrame(rvVersion, rvHello, nil)[:6], -1, "", "hello frame of 65535 bytes exceeds limit 512"},
		{"ring frame before any handshake", ringHeaderClaiming(hugeLength), -1, "", "bad magic"},
		{"other byte order", bad(func(h *rvHelloMsg) { h.swapBOM = true }), rvCodeByteOrder, "other byte order", "other byte order"},
		{"other version", bad(func(h *rvHelloMsg) { h.version = 9 }), rvCodeVersion, fmt.Sprintf("peer 9, ours %d", rvVersion), fmt.Sprintf("other protocol version: peer 9, ours %d", rvVersion)},
		{"truncated hello", rvFrame(rvVersion, rvHello, make([]byte, 40)), rvCodeMalformed, "hello of 40 bytes", "malformed handshake: hello of 40 bytes"},
		{"other job", bad(func(h *rvHelloMsg) { h.job = "stranger" }), rvCodeJob, "stranger", `other job: peer \"stranger\", ours \"e2e\"`},
		{"other world size", bad(func(h *rvHelloMsg) { h.world = 5 }), rvCodeWorld, "peer 5, ours 2", "other world size: peer 5, ours 2"},
		{"other shape digest", bad(func(h *rvHelloMsg) { h.digest[0] ^= 0xff }), rvCodeDigest, "other job shape digest", "other job shape digest"},
		{"well-formed (any token), not forming", replay, rvCodeNotForming, "not in Form", "not forming a ring now"},
		{"replayed hello", replay, rvCodeReplay, "seen before", "replayed handshake"},
	} {
		t.Run(a.name, func(t *testing.T) {
			conn := dialTCP(t, port)
			if a.name == "over-long length" {
				// The header alone, claiming the largest length it can.
				a.send = append(a.send, 0xff, 0xff)
			}
			if _, err := conn.Write(a.send); err != nil {
				t.Fatal(err)
			}
			if a.code < 0 {
				expectClosed(t, conn, 5*time.Second)
			} else {
				expectStatus(t, conn, byte(a.code), a.answer)
			}
			c.expectLogged(1, conn.LocalAddr().String(), a.logged)
		})
	}
	t.Run("slowloris", func(t *testing.T) {
		// They come from 127.0.0.1, node 0's address: prev's slots
		// (rendezvous MaxPending), where a newer handshake evicts the
		// oldest rather than being refused.
		const limit = 64
		var idle []net.Conn
		for i := 0; i < limit; i++ {
			conn := dialTCP(t, port)
			conn.Write([]byte("CLV")) // a header that never completes
			idle = append(idle, conn)
		}
		// Let the daemon take them all before the next ones arrive.
		time.Sleep(300 * time.Millisecond)
		for i := 0; i < 4; i++ {
			conn := dialTCP(t, port)
			conn.Write([]byte("CLV"))
			idle = append(idle, conn)
			expectStatus(t, idle[i], rvCodeBusy, "evicted, the oldest of 64 unauthenticated handshakes")
			c.expectLogged(1, idle[i].LocalAddr().String(), "too many handshakes pending")
		}
		start := time.Now()
		for _, conn := range idle[4:] {
			expectClosed(t, conn, 10*time.Second)
		}
		// The first few of the 64 timeouts are logged in full (the rest
		// are summarised): one of them names its address.
		c.expectLoggedAny(1, idle[4:], "handshake timed out")
		t.Logf("the %d half-open connections were dropped %v after the last was opened", limit, time.Since(start).Round(10*time.Millisecond))
		// The slots are free again: a stranger is answered at once.
		conn := dialTCP(t, port)
		conn.Write(bad(func(h *rvHelloMsg) { h.world = 7 }))
		expectStatus(t, conn, rvCodeWorld, "peer 7")
	})
	c.stopLoop(trs, stopFile, time.Now())
	c.fleet().checkBaselines(bs, 20*time.Second)
}

// TestRingWrongTokenWhileForming: a handshake is only authenticated while
// a ring forms, so the token is attacked then: node 1 starts alone, and
// while it waits for node 0 a stranger claims to be node 0. Node 1's proof
// is checked with the real token (it is right, and useless to the
// stranger), then a proof made with another token, and node 1's own proof
// reflected back, are both refused as authentication failures and logged.
// Node 0 started, the ring forms and allreduces succeed.
func TestRingWrongTokenWhileForming(t *testing.T) {
	c := newLoopCluster(t, 2, 1)
	c.startOnly(1)
	// handshake sends a valid hello as rank 0 and returns the listener's
	// hello and proof, retrying while node 1 is between two formations.
	handshake := func() (net.Conn, []byte, []byte, []byte) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			conn := dialTCP(t, c.addrs[1])
			hd := c.validHello(0).frame()
			conn.Write(hd)
			typ, p, hl, err := readRV(conn, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if typ == rvStatus && len(p) > 0 && p[0] == rvCodeNotForming && time.Now().Before(deadline) {
				conn.Close()
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if typ != rvHello {
				t.Fatalf("answer to a valid hello: type %d %q", typ, p)
			}
			typ, mac, _, err := readRV(conn, 5*time.Second)
			if err != nil || typ != rvAuth {
				t.Fatalf("after its hello node 1 sent type %d (%v), want its proof", typ, err)
			}
			return conn, hd, hl, mac
		}
	}
	proof := func(token, label string, hd, hl []byte) []byte {
		m := hmac.New(sha256.New, []byte(token))
		m.Write([]byte(label))
		m.Write(hd)
		m.Write(hl)
		return m.Sum(nil)
	}

	conn, hd, hl, mac := handshake()
	if !hmac.Equal(mac, proof(c.token, rvListenLabel, hd, hl)) {
		t.Fatalf("node 1's proof is not HMAC-SHA256(token, listener label | our hello | its hello) as documented")
	}
	conn.Write(rvFrame(rvVersion, rvAuth, proof("another job's token, 32 bytes..", rvDialerLabel, hd, hl)))
	expectStatus(t, conn, rvCodeAuth, "proof does not match")
	c.expectLogged(1, conn.LocalAddr().String(), "authentication failed")

	conn, _, _, mac = handshake()
	conn.Write(rvFrame(rvVersion, rvAuth, mac)) // node 1's own proof, reflected
	expectStatus(t, conn, rvCodeAuth, "proof does not match")
	c.expectLogged(1, conn.LocalAddr().String(), "authentication failed")

	c.startOnly(0)
	c.fleet().waitUp(0, 0, 30*time.Second)
	c.fleet().waitUp(1, 0, 30*time.Second)
	trs := []*ftProc{c.startFT(0, "-mode", "loop", "-until-ok", "3", "-max-fails", "1"), c.startFT(1, "-mode", "loop", "-until-ok", "3", "-max-fails", "1")}
	for i, p := range trs {
		evs, err := p.wait(60 * time.Second)
		if err != nil || len(evs) != 3 || !evs[2].OK {
			t.Errorf("trainer on node %d after the attack: %v %+v", i, err, evs)
		}
	}
}

// TestRingFrameClaimingGiB: a man in the middle of the authenticated link
// from node 0 to node 1 rewrites one ring frame header to claim a 3 GiB
// payload, and makes the header's checksum match (a CRC authenticates
// nothing). Node 1 refuses it from the header alone (its memory does not
// grow), logs why, and the ring fails on every trainer naming the bad
// frame, then re-forms; the trainers go on. The dialer's hello the relay
// recorded, played back to node 1, is refused as a replay.
func TestRingFrameClaimingGiB(t *testing.T) {
	c := newLoopCluster(t, 2, 1)
	// Node 1 listens on its own port; the peers list sends node 0 to the
	// relay in front of it. Both are on 127.0.0.1, node 0's address.
	c.listen[1] = c.addrs[1]
	rl := startRelay(t, relayOpts{listen: "127.0.0.1:0", target: c.listen[1]})
	c.addrs[1] = rl.addr()
	c.startAll()
	bs := c.fleet().baselines()
	var trs []*ftProc
	for n := 0; n < 2; n++ {
		trs = append(trs, c.startFT(n, "-mode", "loop", "-count", loopCount, "-until-ok", "3", "-need-fail", "-max-fails", "3"))
	}
	waitFor(t, 60*time.Second, "2 calls each", func() bool { return len(trs[0].events()) >= 2 && len(trs[1].events()) >= 2 })
	rl.corrupt.Store(true)
	select {
	case <-rl.corrupted:
	case <-time.After(20 * time.Second):
		t.Fatal("the relay saw no ring frame to corrupt")
	}
	claim := strconv.Itoa(hugeLength)
	for i, p := range trs {
		evs, err := p.wait(60 * time.Second)
		if err != nil {
			t.Fatalf("trainer %d: %v", i, err)
		}
		fe, ok := firstFailure(evs)
		if !ok || !strings.Contains(fe.Message, claim) || !strings.Contains(fe.Message, "exceeds") {
			t.Fatalf("trainer %d: first failure %+v, want one naming the %s-byte frame", i, fe, claim)
		}
		t.Logf("trainer %d told: %s %s", i, fe.Code, fe.Message)
		if last := evs[len(evs)-1]; !last.OK || last.Gen <= evs[0].Gen {
			t.Fatalf("trainer %d did not recover in a new generation: %+v", i, evs)
		}
	}
	if !strings.Contains(c.fullLog(1), claim) {
		t.Errorf("node 1's log does not name the %s-byte frame", claim)
	}
	// Played back, the genuine hello is refused by its nonce.
	rl.mu.Lock()
	recorded := rl.firstHello
	rl.mu.Unlock()
	conn := dialTCP(t, c.listen[1])
	conn.Write(recorded)
	expectStatus(t, conn, rvCodeReplay, "seen before")
	c.expectLogged(1, conn.LocalAddr().String(), "replayed handshake")
	// rssSlack is far below the 3 GiB claimed.
	c.fleet().checkBaselines(bs, 20*time.Second)
}

// TestUnixSocketAbuse: on the Unix socket, /dev/zero offered as a
// segment is refused (BAD_FD, not a memfd) and the connection goes on;
// 200 fds in one message are refused (BAD_FD, fatal) and all closed; a
// frame claiming 4 GiB after HELLO is refused before allocation; 20
// connections that never say HELLO are closed at the hello timeout. The
// daemon's fds, memfds and memory return to baseline and trainers work.
func TestUnixSocketAbuse(t *testing.T) {
	c := newLoopCluster(t, 1, 2)
	c.startAll()
	bs := c.fleet().baselines()
	sock := c.sockets[0]

	r := dialRaw(t, sock)
	r.hello()
	zero, err := unix.Open("/dev/zero", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(zero)
	r.send(ipc.Register{Size: 4096}.Encode(2), zero)
	r.expectError(ipc.CodeBadFD, "not a memfd", false)
	// The connection goes on.
	r.send(ipc.AppendEmpty(nil, ipc.TypeStatus, 3), -1)
	if typ, _, p := r.read(); typ != ipc.TypeStatusOK || !bytes.Contains(p, []byte(`"job":"e2e"`)) {
		t.Fatalf("after the refused /dev/zero, STATUS got %s %q", typ, p)
	}

	memfd, err := unix.MemfdCreate("flood", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(memfd)
	unix.Ftruncate(memfd, 4096)
	unix.FcntlInt(uintptr(memfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	fds := make([]int, 200)
	for i := range fds {
		fds[i] = memfd // the kernel installs 200 distinct fds in the receiver
	}
	if _, _, err := r.uc.WriteMsgUnix(ipc.Register{Size: 4096}.Encode(4), unix.UnixRights(fds...), nil); err != nil {
		t.Fatal(err)
	}
	r.expectError(ipc.CodeBadFD, "more than", true)

	r2 := dialRaw(t, sock)
	r2.hello()
	h := ipc.Header{Length: 0xfffffff0, Type: ipc.TypeCall, ID: 2}
	var hb [ipc.HeaderSize]byte
	h.Put(hb[:])
	r2.send(hb[:], -1)
	r2.expectError(ipc.CodeBadFrame, "4294967280", true)

	var idle []*rawClient
	for i := 0; i < 20; i++ {
		idle = append(idle, dialRaw(t, sock))
	}
	start := time.Now()
	for _, r := range idle {
		r.expectError(ipc.CodeTimeout, "no HELLO within 2s", true) // timeouts.hello in fastTimeouts
	}
	t.Logf("20 silent connections closed %v after they opened", time.Since(start).Round(10*time.Millisecond))

	c.fleet().checkBaselines(bs, 20*time.Second)
	for _, p := range []*ftProc{c.startFT(0, "-mode", "loop", "-until-ok", "2", "-max-fails", "1"), c.startFT(0, "-mode", "loop", "-until-ok", "2", "-max-fails", "1")} {
		if evs, err := p.wait(30 * time.Second); err != nil || len(evs) != 2 || !evs[1].OK {
			t.Fatalf("trainer after the abuse: %v %+v", err, evs)
		}
	}
}
