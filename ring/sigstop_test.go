package ring

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const helperEnv = "RING_TEST_HELPER_NEXT"

// TestHelperRank is not a test: it is rank 1 of TestSIGSTOPPedPeer's ring,
// run in a child process so that it can be stopped with SIGSTOP.
func TestHelperRank(t *testing.T) {
	next := os.Getenv(helperEnv)
	if next == "" {
		t.Skip("helper process for TestSIGSTOPPedPeer")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("LISTEN %s\n", l.Addr())
	nc, err := net.Dial("tcp", next)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(sigstopConfig(1), Links{Next: []net.Conn{nc}, Prev: []net.Conn{pc}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, arDesc.Bytes())
	for r.AllReduce(arDesc, buf) == nil {
	}
}

func sigstopConfig(rank int) Config {
	c := testConfig(rank, 3)
	c.OpTimeout = 60 * time.Second
	c.HeartbeatInterval = 100 * time.Millisecond
	c.HeartbeatTimeout = 1500 * time.Millisecond
	return c
}

// TestSIGSTOPPedPeer stops a real rank process: it is alive at the TCP
// level but sends nothing, and both neighbours find it by heartbeat long
// before the op timeout.
func TestSIGSTOPPedPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	l0, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l0.Close()
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRank$", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+l2.Addr().String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "LISTEN "); ok {
				addr <- a
			}
		}
	}()
	var helperAddr string
	select {
	case helperAddr = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatal("helper rank did not start")
	}
	// rank 0 -> helper (rank 1) -> rank 2 -> rank 0
	n0, err := net.Dial("tcp", helperAddr)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := l2.Accept()
	if err != nil {
		t.Fatal(err)
	}
	n2, err := net.Dial("tcp", l0.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p0, err := l0.Accept()
	if err != nil {
		t.Fatal(err)
	}
	rings := make([]*Ring, 3)
	for i, l := range map[int]Links{0: {Next: []net.Conn{n0}, Prev: []net.Conn{p0}}, 2: {Next: []net.Conn{n2}, Prev: []net.Conn{p2}}} {
		r, err := New(sigstopConfig(i), l)
		if err != nil {
			t.Fatal(err)
		}
		rings[i] = r
		defer r.Close()
	}
	startAll(t, rings)
	var stopped sync.Once
	t0 := time.Now()
	var stopAt time.Time
	errs := opOnReal(t, rings, 40*time.Second, func(i int, r *Ring) error {
		buf := make([]byte, arDesc.Bytes())
		for k := 0; ; k++ {
			if k == 20 && i == 0 {
				stopped.Do(func() {
					stopAt = time.Now()
					if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
						t.Errorf("SIGSTOP %d: %v", pid, err)
					}
				})
			}
			if err := r.AllReduce(arDesc, buf); err != nil {
				return err
			}
			if time.Since(t0) > 30*time.Second {
				return errors.New("no failure 30s after SIGSTOP")
			}
		}
	})
	expectAll(t, rings, errs, ErrPeerHung, "rank 1")
	if d := time.Since(stopAt); d > 20*time.Second {
		t.Errorf("the stopped rank was found after %v; op timeout is 60s", d)
	}
}
