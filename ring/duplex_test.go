package ring

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/collective"
)

// tcpCounts is what the kernel counted on one end of a TCP connection:
// segments sent, and of those the ones that carried data.
type tcpCounts struct{ segsOut, dataOut, dataIn uint32 }

func countsOf(t *testing.T, c net.Conn) tcpCounts {
	t.Helper()
	rc := rawConn(c)
	if rc == nil {
		t.Fatalf("%T is not a socket", c)
	}
	var info *unix.TCPInfo
	var err error
	if cerr := rc.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatalf("TCP_INFO: %v", err)
	}
	return tcpCounts{segsOut: info.Segs_out, dataOut: info.Data_segs_out, dataIn: info.Data_segs_in}
}

// In a ring of two, short allreduces and barriers travel both ways on
// the duplex stream, so its acknowledgements ride on the data and
// neither end sends bare ACKs; the other link's first stream carries no
// data for them; a small-path allreduce longer than duplexBytes, and a
// large op, keep to the one-way streams.
func TestDuplexCarriesShortOpsBothWays(t *testing.T) {
	rings := lentWorld(t, 2, 2, func(c *Config) {
		// No heartbeats while counting: they are data segments too.
		c.HeartbeatInterval = time.Hour
		c.HeartbeatTimeout = 2 * time.Hour
	})
	if rings[0].pair == nil || rings[0].pair[0] != rings[0].next[0] || rings[1].pair[0] != rings[1].prev[0] {
		t.Fatal("the duplex stream is not rank 0's next[0] and rank 1's prev[0]")
	}
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3}
	calls := func(k int) {
		for j := 0; j < k; j++ {
			bufs, want := float32Bufs(2, 3, j)
			noErrors(t, "small allreduce", onAll(t, rings, func(i int, r *Ring) error {
				if j%2 == 0 {
					return r.AllReduceLent(d, [][]byte{bufs[i]}, nil)
				}
				return r.AllReduce(d, bufs[i])
			}))
			checkFloat32(t, "small allreduce", bufs, want)
			if j%50 == 0 {
				noErrors(t, "barrier", onAll(t, rings, func(i int, r *Ring) error { return r.Barrier(barrierDesc) }))
			}
		}
	}
	calls(50) // past TCP's quick acknowledgements at the start of a connection
	const n = 400
	dup := [2]net.Conn{rings[0].next[0].conn, rings[1].prev[0].conn}
	oneWay := rings[0].prev[0].conn // rank 1's next[0]
	var before [2]tcpCounts
	for i, c := range dup {
		before[i] = countsOf(t, c)
	}
	oneWayBefore := countsOf(t, oneWay)
	calls(n)
	for i, c := range dup {
		after := countsOf(t, c)
		data, bare := after.dataOut-before[i].dataOut, (after.segsOut-after.dataOut)-(before[i].segsOut-before[i].dataOut)
		if data < n {
			t.Errorf("rank %d sent %d data segments on the duplex stream in %d calls, want at least one per call", i, data, n)
		}
		// One-way streams send a bare ACK for every frame or every other
		// one (408 in 408 calls here, routed the old way). On the duplex
		// stream they are few: a delayed ACK goes out bare only when the
		// answer takes longer than the kernel waits, which a loaded
		// machine (-race, parallel tests) makes happen now and then.
		t.Logf("rank %d: %d bare ACKs, %d data segments on the duplex stream in %d calls", i, bare, data, n)
		if bare > n/2 {
			t.Errorf("rank %d sent %d bare ACKs on the duplex stream in %d calls, want at most %d", i, bare, n, n/2)
		}
	}
	if got := countsOf(t, oneWay).dataIn - oneWayBefore.dataIn; got != 0 {
		t.Errorf("rank 0 received %d data segments from rank 1's one-way stream 0 during short ops, want 0", got)
	}
	for _, count := range []int{duplexBytes/4 + 1, 1 << 20} {
		before := countsOf(t, oneWay)
		d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: uint64(count)}
		bufs, want := float32Bufs(2, count, 1)
		noErrors(t, "allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d, [][]byte{bufs[i]}, nil) }))
		checkFloat32(t, "allreduce", bufs, want)
		if got := countsOf(t, oneWay).dataIn - before.dataIn; got == 0 {
			t.Errorf("an allreduce of %d bytes sent nothing on rank 1's one-way stream 0", d.Bytes())
		}
	}
	// A small allreduce too long for the duplex stream borrows the one-way
	// stream it receives on instead; lent calls alternating between the
	// two keep both lent, and any other op gives both back.
	d16 := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: duplexBytes/4 + 1}
	bothLent := 0
	for k := 0; k < 100; k++ {
		d := d16
		if k%2 == 1 {
			d = collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3}
		}
		bufs, want := float32Bufs(2, int(d.Count), k)
		noErrors(t, "allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d, [][]byte{bufs[i]}, nil) }))
		checkFloat32(t, "allreduce", bufs, want)
		if rings[0].prev[0].lend.Load() == lendOut && rings[0].pair[0].lend.Load() == lendOut {
			bothLent++
		}
	}
	if bothLent == 0 {
		t.Errorf("rank 0 never had both its one-way stream 0 and the duplex stream lent in 100 lent calls alternating %d and 12 bytes", d16.Bytes())
	}
	bufs, _ := float32Bufs(2, 3, 0)
	noErrors(t, "allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduce(d, bufs[i]) }))
	for _, s := range rings[0].lenders {
		if st := s.lend.Load(); st != lendNone {
			t.Errorf("rank 0's lendable stream (duplex %v) is still lent (state %d) after an op that is not", s.duplex, st)
		}
	}
}

// Rank 0's end of the duplex stream receives short frames only: a longer
// one is a bad frame naming both lengths, not a write past its buffer.
func TestDuplexLongFrameRefused(t *testing.T) {
	rings, links := faultWorld(t, 2, map[int]bool{1: true}, func(c *Config) { c.SmallBytes = 4096 })
	fake := newFakeRank(links[1], 1, 2)
	go fake.start(11)
	defer fake.closeAll()
	startAll(t, rings)
	d := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3}
	h := header{Kind: kindData, Sender: 1, Generation: 11, Length: 8192}
	h.setDesc(&d, d.Fingerprint())
	b := make([]byte, headerLen+8192)
	h.encode(b)
	b = seal(b)
	time.AfterFunc(50*time.Millisecond, func() { fake.writeData(true, b) })
	err := rings[0].AllReduce(d, make([]byte, d.Bytes()))
	if !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), "data frame of 8192 bytes on the duplex stream, which carries frames of at most 4096") {
		t.Fatalf("got %v, want a bad frame of 8192 bytes on the duplex stream", err)
	}
}

// Only stream 0 is duplex: a data frame coming back on rank 0's second
// stream to next is still refused.
func TestDuplexOnlyFirstStream(t *testing.T) {
	rings, links := faultWorldOver(t, 2, true, map[int]bool{1: true}, nil)
	fake := newFakeRank(links[1], 1, 2)
	go fake.start(11)
	defer fake.closeAll()
	startAll(t, rings)
	h := header{Kind: kindData, Sender: 1, Generation: 11}
	h.setDesc(&barrierDesc, barrierDesc.Fingerprint())
	b := make([]byte, headerLen)
	h.encode(b)
	time.AfterFunc(50*time.Millisecond, func() { _, _ = links[1].Prev[1].Write(b) })
	err := rings[0].Barrier(barrierDesc)
	if !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), "data frame on the backward direction") {
		t.Fatalf("got %v, want a data frame on the backward direction refused", err)
	}
}

// waitFor polls cond for up to 10 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// In a ring of two a short op waits on the duplex stream while a
// broadcast from rank 1 sends its description check on the other link:
// both ranks find the mismatch at once (no heartbeats here to announce
// it), whether rank 1's frame lands while rank 0's op waits or before the
// op begins. A broadcast ends only once every rank's call was compared
// (agree in ops.go), so rank 1 fails too, and cannot get ahead.
func TestDuplexMismatchFoundAtOnce(t *testing.T) {
	bcast := collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: 1, Root: 1}
	ar := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1}
	for _, c := range []struct {
		name  string
		first bool // rank 1's frame has arrived before rank 0 calls
		lent  bool
	}{{"together", false, false}, {"together lent", false, true}, {"peer first", true, false}, {"peer first lent", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			rings, _ := faultWorld(t, 2, nil, func(cfg *Config) {
				cfg.Spin = 200 * time.Microsecond
				cfg.OpTimeout = 30 * time.Second
				cfg.HeartbeatInterval = time.Hour
				cfg.HeartbeatTimeout = 2 * time.Hour
			})
			startAll(t, rings)
			allReduce := func() error {
				if c.lent {
					return rings[0].AllReduceLent(ar, [][]byte{make([]byte, 4)}, nil)
				}
				return rings[0].AllReduce(ar, make([]byte, 4))
			}
			errs := make([]error, 2)
			if c.first {
				done := make(chan error, 1)
				go func() { done <- rings[1].Broadcast(bcast, make([]byte, 4)) }()
				waitFor(t, "rank 0 sees rank 1's broadcast", func() bool {
					p, ok := rings[0].PeerInOp()
					return ok && p.Seq == 0 && p.Desc.Op == collective.OpBroadcast
				})
				errs[0] = opOnReal(t, rings[:1], 10*time.Second, func(int, *Ring) error { return allReduce() })[0]
				select {
				case errs[1] = <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("rank 1's broadcast still waits 10s after rank 0 found the mismatch")
				}
			} else {
				errs = opOnReal(t, rings, 10*time.Second, func(i int, r *Ring) error {
					if i == 1 {
						return r.Broadcast(bcast, make([]byte, 4))
					}
					return allReduce()
				})
			}
			for i, err := range errs {
				if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "broadcast(float32, count=1, root=1)") ||
					!strings.Contains(err.Error(), "allreduce(float32, sum, count=1)") {
					t.Errorf("rank %d: got %v, want a mismatch naming both calls", i, err)
				}
			}
			if c.first && !strings.Contains(errs[0].Error(), "rank 1 sent seq 0 broadcast(float32, count=1, root=1)") {
				t.Errorf("rank 0: got %v, want the mismatch found in rank 1's frame", errs[0])
			}
		})
	}
}

// Rank 0 keeps the duplex stream lent, unread, through lent calls that
// receive on the one-way stream; a peer slow to make such a call (longer
// than the heartbeat timeout) is not taken for hung on the duplex
// stream, whose heartbeats wait unread until the heartbeat loop gives
// the link back to its reader.
func TestDuplexKeptLentIsNotHung(t *testing.T) {
	rings := lentWorld(t, 2, 1, func(c *Config) {
		c.HeartbeatInterval = 20 * time.Millisecond
		c.HeartbeatTimeout = 200 * time.Millisecond
	})
	short := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3}
	longer := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: duplexBytes/4 + 1}
	for k := 0; k < 20; k++ {
		bufs, want := float32Bufs(2, 3, k)
		noErrors(t, "short", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(short, [][]byte{bufs[i]}, nil) }))
		checkFloat32(t, "short", bufs, want)
	}
	waitFor(t, "rank 0's duplex stream lent", func() bool { return rings[0].pair[0].lend.Load() == lendOut })
	bufs, want := float32Bufs(2, int(longer.Count), 1)
	noErrors(t, "a longer small allreduce, rank 1 late", onAll(t, rings, func(i int, r *Ring) error {
		if i == 1 {
			time.Sleep(3 * rings[0].cfg.HeartbeatTimeout)
		}
		return r.AllReduceLent(longer, [][]byte{bufs[i]}, nil)
	}))
	checkFloat32(t, "a longer small allreduce", bufs, want)
}

// keepBothLent makes rank 0 of a ring of two keep both its links lent:
// lent calls alternating between a 16 KiB and a short allreduce.
func keepBothLent(t *testing.T, rings []*Ring) {
	t.Helper()
	short := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3}
	d16 := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: duplexBytes/4 + 1}
	waitFor(t, "both of rank 0's links lent", func() bool {
		for k := 0; k < 2; k++ {
			d := d16
			if k == 1 {
				d = short
			}
			bufs, want := float32Bufs(2, int(d.Count), k)
			noErrors(t, "lent allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d, [][]byte{bufs[i]}, nil) }))
			checkFloat32(t, "lent allreduce", bufs, want)
		}
		return rings[0].prev[0].lend.Load() == lendOut && rings[0].pair[0].lend.Load() == lendOut
	})
}

// Rank 0 idle with both links kept lent still hears rank 1: its abort is
// read (the heartbeat loop gives back a lent link nobody reads once
// something waits on it) and names rank 1's reason, not a broken pipe.
func TestDuplexKeptLentHearsThePeer(t *testing.T) {
	rings := lentWorld(t, 2, 1, func(c *Config) {
		c.HeartbeatInterval = 200 * time.Millisecond
		c.HeartbeatTimeout = 20 * time.Second
		c.AbortWait = 3 * time.Second
	})
	keepBothLent(t, rings)
	t0 := time.Now()
	rings[1].Abort(errors.New("rank 1's owner gave up"))
	select {
	case <-rings[0].Done():
	case <-time.After(5 * time.Second):
		t.Fatal("rank 0, idle with both links lent, has not learnt of rank 1's abort after 5s")
	}
	t.Logf("rank 0 failed after %v: %v", time.Since(t0), rings[0].Err())
	if err := rings[0].Err(); !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 1's owner gave up") {
		t.Errorf("rank 0: %v, want rank 1's abort and its reason", err)
	}
}

// A short lent call on the duplex stream while rank 1 broadcasts on the
// kept (lent, unread) one-way stream finds the mismatch in that frame
// within a few lentParks, not at the op timeout.
func TestDuplexKeptLentMismatch(t *testing.T) {
	rings, _ := faultWorld(t, 2, nil, func(c *Config) {
		c.Spin = 200 * time.Microsecond
		c.StripeBytes = 64 << 10
		c.OpTimeout = 30 * time.Second
		c.HeartbeatInterval = time.Hour
		c.HeartbeatTimeout = 2 * time.Hour
	})
	startAll(t, rings)
	keepBothLent(t, rings)
	bcast := collective.Desc{Op: collective.OpBroadcast, DType: collective.Float32, Count: 1, Root: 1}
	ar := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 1}
	errs := opOnReal(t, rings, 10*time.Second, func(i int, r *Ring) error {
		if i == 1 {
			return r.Broadcast(bcast, make([]byte, 4))
		}
		return r.AllReduceLent(ar, [][]byte{make([]byte, 4)}, nil)
	})
	for i, err := range errs {
		if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "broadcast(float32, count=1, root=1)") {
			t.Errorf("rank %d: got %v, want the mismatch naming rank 1's broadcast", i, err)
		}
	}
}

// A write that fails on the duplex stream lent to rank 0 fails the call
// at once: the op goroutine gives the link back to its reader, which
// finds the peer gone, instead of writeFailed waiting AbortWait for a
// reader that is parked. So it goes for a short call, which reads the
// duplex stream itself, and for a 16 KiB one, which reads the one-way
// stream and only writes on the duplex stream, kept lent.
func TestDuplexLentWriteFails(t *testing.T) {
	short := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: 3}
	d16 := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: duplexBytes/4 + 1}
	for _, d := range []collective.Desc{short, d16} {
		t.Run(fmt.Sprintf("%d bytes", d.Bytes()), func(t *testing.T) {
			const abortWait = 30 * time.Second
			rings, links := faultWorld(t, 2, map[int]bool{1: true}, func(c *Config) {
				c.Spin = 200 * time.Microsecond
				c.AbortWait = abortWait
				c.OpTimeout = 2 * abortWait
				c.HeartbeatInterval = time.Hour // no heartbeat write finds the reset first
				c.HeartbeatTimeout = 2 * time.Hour
			})
			fake := newFakeRank(links[1], 1, 2)
			go fake.start(11)
			defer fake.closeAll()
			startAll(t, rings)
			r := rings[0]
			h := header{Kind: kindData, Sender: 1, Generation: 11, Length: uint32(short.Bytes())}
			h.setDesc(&short, short.Fingerprint())
			b := make([]byte, headerLen+int(short.Bytes()))
			h.encode(b)
			b = seal(b)
			time.AfterFunc(20*time.Millisecond, func() { fake.writeData(true, b) })
			if err := r.AllReduceLent(short, [][]byte{make([]byte, short.Bytes())}, nil); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the duplex stream lent", func() bool { return r.pair[0].lend.Load() == lendOut })

			// The peer resets the duplex connection alone; the other stays up.
			dup := links[1].Prev[0].(*net.TCPConn)
			if err := dup.SetLinger(0); err != nil {
				t.Fatal(err)
			}
			dup.Close()
			waitFor(t, "rank 0's end of the duplex connection reset", func() bool {
				var info *unix.TCPInfo
				_ = rawConn(r.pair[0].conn).Control(func(fd uintptr) {
					info, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
				})
				return info != nil && info.State == unix.BPF_TCP_CLOSE
			})

			errc := make(chan error, 1)
			go func() { errc <- r.AllReduceLent(d, [][]byte{make([]byte, d.Bytes())}, nil) }()
			select {
			case err := <-errc:
				if !errors.Is(err, ErrPeerClosed) || !strings.Contains(err.Error(), "rank 1") {
					t.Fatalf("got %v, want the peer closed, naming rank 1", err)
				}
				t.Logf("rank 0: %v", err)
			case <-time.After(abortWait / 3):
				t.Fatalf("the call's write failed on the reset duplex stream and the call has not returned after %v (AbortWait %v)", abortWait/3, abortWait)
			}
		})
	}
}
