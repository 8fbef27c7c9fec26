package ring

import (
	"errors"
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
	// stream it receives on instead; the duplex stream goes back.
	d16 := collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum, Count: duplexBytes/4 + 1}
	borrowed := 0
	for k := 0; k < 50; k++ {
		bufs, want := float32Bufs(2, int(d16.Count), k)
		noErrors(t, "allreduce", onAll(t, rings, func(i int, r *Ring) error { return r.AllReduceLent(d16, [][]byte{bufs[i]}, nil) }))
		checkFloat32(t, "allreduce", bufs, want)
		if rings[0].prev[0].lend.Load() == lendOut {
			borrowed++
		}
		if rings[0].pair[0].lend.Load() == lendOut {
			t.Fatal("the duplex stream is still lent during calls that receive on the one-way stream")
		}
	}
	if borrowed == 0 {
		t.Errorf("rank 0 never borrowed its one-way stream 0 in 50 lent calls of %d bytes", d16.Bytes())
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
