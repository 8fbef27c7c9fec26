package e2e

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A relay is a TCP proxy the test puts on one ring link: it delays every
// chunk of bytes (with jitter, keeping their order), and on request
// rewrites the next ring frame header the dialer sends, so that the
// listening daemon receives what a broken or hostile peer would send, or
// flips a byte of a data frame's payload, as a faulty link would.
// It can live in a node's network namespace: its listening and dialing
// sockets are then made by a goroutine locked to a thread that entered
// that namespace, and that thread exits with the goroutine, never to be
// reused elsewhere.
type relay struct {
	t             *testing.T
	ln            net.Listener
	target        string
	delay, jitter time.Duration
	mark          int // SO_MARK on upstream sockets, so a DNAT rule can spare them; 0: none

	accepted atomic.Int64
	bytes    atomic.Int64

	corrupt   atomic.Bool   // armed: the next ring frame header dialer->listener claims 3 GiB (its checksum made to match)
	corrupted chan struct{} // closed when that header went out

	flip    atomic.Bool   // armed: one payload byte of the next step-0 data frame dialer->listener is flipped
	flipped chan struct{} // closed when that frame went out
	flipNs  atomic.Int64  // when (Unix nanoseconds), set before flipped is closed

	mu         sync.Mutex
	conns      []net.Conn
	firstHello []byte // the first rendezvous hello a dialer sent, as sent
	closed     bool
	wg         sync.WaitGroup
}

type relayOpts struct {
	netns         string // "" = the test's own namespace
	listen        string // host:port to listen on (port 0: any)
	target        string // where to forward
	delay, jitter time.Duration
	mark          int
}

// hugeLength is what a corrupted ring frame header claims: 3 GiB.
const hugeLength = 3 << 30

func startRelay(t *testing.T, o relayOpts) *relay {
	t.Helper()
	r := &relay{t: t, target: o.target, delay: o.delay, jitter: o.jitter, mark: o.mark,
		corrupted: make(chan struct{}), flipped: make(chan struct{})}
	ready := make(chan error, 1)
	r.wg.Add(1)
	go r.acceptLoop(o.netns, o.listen, ready)
	if err := <-ready; err != nil {
		t.Fatalf("relay: %v", err)
	}
	t.Cleanup(r.close)
	return r
}

func (r *relay) addr() string { return r.ln.Addr().String() }

// acceptLoop owns the listener. It dials upstream itself, so that in a
// namespace both sockets are made on the namespaced thread.
func (r *relay) acceptLoop(netns, listen string, ready chan<- error) {
	defer r.wg.Done()
	if netns != "" {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		f, err := os.Open("/run/netns/" + netns)
		if err != nil {
			ready <- err
			return
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			ready <- fmt.Errorf("setns %s: %w", netns, err)
			return
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		ready <- err
		return
	}
	r.ln = ln
	ready <- nil
	d := net.Dialer{Timeout: 5 * time.Second}
	if r.mark != 0 {
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, r.mark)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	for {
		down, err := ln.Accept()
		if err != nil {
			return
		}
		up, err := d.Dial("tcp", r.target)
		if err != nil {
			down.Close()
			continue
		}
		if !r.track(down, up) {
			return
		}
		r.accepted.Add(1)
		r.wg.Add(2)
		go func() { defer r.wg.Done(); r.forward(up, down) }()
		go func() { defer r.wg.Done(); r.delayedCopy(down, up) }()
	}
}

func (r *relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	r.conns = append(r.conns, cs...)
	return true
}

func (r *relay) close() {
	r.mu.Lock()
	r.closed = true
	cs := r.conns
	r.conns = nil
	r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
	}
	for _, c := range cs {
		c.Close()
	}
	r.wg.Wait()
}

// ringHeaderLen is the length of a ring frame header (ring/doc.go): its
// CRC32C sits in the last 4 bytes, over the bytes before them. A payload
// is followed by its own CRC32C (ringTrailerLen bytes).
const (
	ringHeaderLen  = 68
	ringTrailerLen = 4
)

// sealRingHeader sets a ring frame header's checksum to match what it
// holds, as a man in the middle who rewrites a header does: the checksum
// detects corruption, it authenticates nothing.
func sealRingHeader(h []byte) {
	binary.LittleEndian.PutUint32(h[ringHeaderLen-4:], crc32.Checksum(h[:ringHeaderLen-4], crc32.MakeTable(crc32.Castagnoli)))
}

// forward carries the dialer's bytes to the listener: the rendezvous
// frames (8-byte header, big-endian u16 length) first, then ring frames
// (ringHeaderLen-byte header, kind at 5, little-endian u32 length at 52,
// the payload and its trailer), one whole frame at a time, so that a
// corruption lands on a header and a flip on a data frame's payload.
// Delays apply as in delayedCopy.
func (r *relay) forward(dst, src net.Conn) {
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() { defer close(done); r.delayedCopy(dst, pr) }()
	err := r.frames(pw, bufio.NewReaderSize(src, 64<<10))
	pw.CloseWithError(err)
	<-done
	src.Close()
}

func (r *relay) frames(w io.Writer, br *bufio.Reader) error {
	var h [ringHeaderLen]byte
	// The dialer sends its hello, then its proof (or a status refusing).
	for i := 0; i < 2; i++ {
		if _, err := io.ReadFull(br, h[:8]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint16(h[6:8]))
		frame := make([]byte, 8+n)
		copy(frame, h[:8])
		if _, err := io.ReadFull(br, frame[8:]); err != nil {
			return err
		}
		if i == 0 {
			r.mu.Lock()
			if r.firstHello == nil {
				r.firstHello = frame
			}
			r.mu.Unlock()
		}
		if _, err := w.Write(frame); err != nil {
			return err
		}
		if h[5] == 3 { // status: the dialer refused; the rest is not ring traffic
			_, err := io.Copy(w, br)
			return err
		}
	}
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return err
		}
		if string(h[:4]) != "CRNG" {
			return fmt.Errorf("relay lost the ring frame boundary: % x", h[:8])
		}
		if r.corrupt.CompareAndSwap(true, false) {
			binary.LittleEndian.PutUint32(h[52:], hugeLength)
			sealRingHeader(h[:])
			_, err := w.Write(h[:])
			close(r.corrupted)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, br) // whatever follows is no longer framed for the receiver
			return err
		}
		n := int64(binary.LittleEndian.Uint32(h[52:]))
		if _, err := w.Write(h[:]); err != nil {
			return err
		}
		if h[5] == 1 && n > 0 && binary.LittleEndian.Uint32(h[48:]) == 0 && r.flip.CompareAndSwap(true, false) { // a data frame of step 0
			// XOR 0x10 into byte 2 of a float32 near the middle of the
			// payload: 1.0 becomes 1.125, 2.0 becomes 2.25.
			p := make([]byte, n+ringTrailerLen)
			if _, err := io.ReadFull(br, p); err != nil {
				return err
			}
			p[(n/2)&^3+2] ^= 0x10
			r.flipNs.Store(time.Now().UnixNano())
			close(r.flipped)
			if _, err := w.Write(p); err != nil {
				return err
			}
			continue
		}
		if n > 0 {
			n += ringTrailerLen
		}
		if _, err := io.CopyN(w, br, n); err != nil {
			return err
		}
	}
}

// delayedCopy copies src to dst, holding each chunk for delay ± jitter
// after it was read; chunks leave in order (a later chunk never leaves
// before an earlier one), as on a slow link.
func (r *relay) delayedCopy(dst io.WriteCloser, src io.Reader) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, 64) // bounded: a slow reader pushes back
	go func() {
		defer close(ch)
		var last time.Time
		for {
			b := make([]byte, 64<<10)
			n, err := src.Read(b)
			if n > 0 {
				due := time.Now().Add(r.delay)
				if r.jitter > 0 {
					due = due.Add(time.Duration(rand.Int64N(int64(2*r.jitter))) - r.jitter)
				}
				if due.Before(last) {
					due = last
				}
				last = due
				ch <- chunk{b[:n], due}
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	for c := range ch {
		if failed {
			continue // drain so the reader can end
		}
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.b); err != nil {
			failed = true
			if rc, ok := src.(io.Closer); ok {
				rc.Close()
			}
			continue
		}
		r.bytes.Add(int64(len(c.b)))
	}
	if tc, ok := dst.(*net.TCPConn); ok && !failed {
		tc.CloseWrite()
	} else {
		dst.Close()
	}
}

// TestNetnsDelayLoss: the link from node 1 to node 2 goes through a relay
// adding 20 ms ± 10 ms each way, and 1% of the (wire-sized: no
// segmentation offload) packets on it are dropped (iptables statistic,
// both directions; the kernel has no netem). Every
// trainer still gets bit-identical, exact results for every dtype, op,
// size and path of a reduced sweep.
func TestNetnsDelayLoss(t *testing.T) {
	requireNetns(t)
	requireIptables(t)
	c := newNetCluster(t, netNodes, netLocal)
	const from, to = 1, 2
	const mark = 0x77
	rl := startRelay(t, relayOpts{netns: c.netns[from], listen: c.nodeIP(from) + ":0", target: c.addrs[to],
		delay: 20 * time.Millisecond, jitter: 10 * time.Millisecond, mark: mark})
	// Node 1's connections to node 2's ring port go to the relay instead,
	// except the relay's own (marked) ones.
	c.iptables(from, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", c.nodeIP(to), "--dport", strconv.Itoa(ringPort),
		"-m", "mark", "!", "--mark", strconv.Itoa(mark), "-j", "DNAT", "--to-destination", rl.addr())
	// TCP segmentation offload would hand the veths 64 KiB super-packets,
	// and 1% of those is not 1% of the packets a wire carries: one MSS per
	// packet at both ends of the link.
	for _, n := range []int{from, to} {
		c.ipn(c.netns[n], "link", "set", "dev", "eth0", "gso_max_segs", "1")
	}
	// Count, then drop 1%, of the link's packets at each end.
	for _, e := range []struct{ at, peer int }{{to, from}, {from, to}} {
		c.iptables(e.at, "-A", "INPUT", "-p", "tcp", "-s", c.nodeIP(e.peer))
		c.iptables(e.at, "-A", "INPUT", "-p", "tcp", "-s", c.nodeIP(e.peer), "-m", "statistic", "--mode", "random", "--probability", "0.01", "-j", "DROP")
	}
	c.startAll()
	bs := c.fleet().baselines()
	trs := make([]*trainer, 0, netNodes*netLocal)
	for n := 0; n < netNodes; n++ {
		for l := 0; l < netLocal; l++ {
			trs = append(trs, c.startTrainerIn(n, "-mode", "sweep", "-sizes", "4,65540,1048588",
				"-dtypes", "float32,int64", "-ops", "sum,max", "-paths", "inline,shm"))
		}
	}
	checkSameResults(t, trs, 2*2*3*2)
	if rl.accepted.Load() == 0 {
		t.Fatalf("the relay carried no connection: the link from node %d to node %d bypassed it", from, to)
	}
	// Each 1 MiB call moves 3/4 of its bytes over every link; 8 of the
	// 24 calls are 1 MiB.
	if got := rl.bytes.Load(); got < 6<<20 {
		t.Fatalf("the relay carried only %d bytes", got)
	}
	var seen, dropped int64
	for _, e := range []struct{ at, peer int }{{to, from}, {from, to}} {
		s, d := inputCounters(t, c, e.at, c.nodeIP(e.peer))
		seen += s
		dropped += d
	}
	t.Logf("relay: %d connections, %d bytes delayed 20±10 ms; iptables: %d packets on the link, %d dropped",
		rl.accepted.Load(), rl.bytes.Load(), seen, dropped)
	// About 14,000 wire-sized packets cross the link: the loss rule drops
	// 1% of them, about 140 (standard deviation 12); the bounds below are
	// 7 standard deviations away.
	if seen < 5000 {
		t.Fatalf("only %d packets crossed the link: too few for 1%% loss to be exercised (offload not off?)", seen)
	}
	if rate := float64(dropped) / float64(seen); rate < 0.004 || rate > 0.02 {
		t.Errorf("%d of %d packets dropped (%.2f%%), want about 1%%: the loss rule did not act as configured", dropped, seen, 100*rate)
	}
	c.fleet().checkBaselines(bs, 20*time.Second)
}

// inputCounters reads the packet counters of the counting rule and the
// drop rule for src in node i's INPUT chain.
func inputCounters(t *testing.T, c *cluster, i int, src string) (seen, dropped int64) {
	t.Helper()
	out := c.iptables(i, "-L", "INPUT", "-v", "-n", "-x")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 8 || !strings.Contains(line, src) {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if strings.Contains(line, "DROP") {
			dropped = n
		} else {
			seen = n
		}
	}
	return seen, dropped
}
