// Command doorbell measures what a world-2 small allreduce could cost if
// trainers rang their daemon through shared memory instead of a Unix
// socket: four processes, each daemon a single goroutine that polls its
// trainer's doorbell (a word in a memfd) and its TCP link to the other
// daemon, each trainer a single goroutine that polls for its answer. It is
// a prototype for docs/TUNING.md, not collectived's code.
//
//	go run ./bench/floor/doorbell [-iters 20000] [-gosched]
//
// -gosched adds runtime.Gosched to every empty poll, as a poller sharing
// its P with other goroutines must do; the difference is that cost.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const pageSize = 4096

var (
	iters   = flag.Int("iters", 20000, "round trips")
	gosched = flag.Bool("gosched", false, "runtime.Gosched on every empty poll")
	role    = flag.String("role", "", "internal: trainer or daemon")
	peer    = flag.String("peer", "", "internal: listen:PORT or dial:PORT")
)

func main() {
	flag.Parse()
	var err error
	switch *role {
	case "":
		err = run()
	case "trainer":
		_, err = trainer(bell(3), false)
	case "daemon":
		err = daemon(bell(3), *peer)
	default:
		err = fmt.Errorf("unknown -role %q", *role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "doorbell:", err)
		os.Exit(1)
	}
}

func yield() {
	if *gosched {
		runtime.Gosched()
	}
	_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}

// doorbell: the trainer stores call k in req; the daemon stores k in resp
// when call k is done.
type doorbell struct{ req, resp *uint32 }

func bell(fd int) doorbell {
	b, err := unix.Mmap(fd, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		panic(err)
	}
	return doorbell{req: (*uint32)(unsafe.Pointer(&b[0])), resp: (*uint32)(unsafe.Pointer(&b[64]))}
}

func run() error {
	if *iters < 1 {
		return fmt.Errorf("-iters %d: want at least 1", *iters)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var mems [2]*os.File
	for i := range mems {
		fd, err := unix.MemfdCreate("doorbell", unix.MFD_CLOEXEC)
		if err != nil {
			return err
		}
		mems[i] = os.NewFile(uintptr(fd), "doorbell")
		if err := mems[i].Truncate(pageSize); err != nil {
			return err
		}
	}
	common := []string{"-iters", strconv.Itoa(*iters), "-gosched=" + strconv.FormatBool(*gosched)}
	start := func(mem *os.File, args ...string) (*exec.Cmd, error) {
		c := exec.Command(self, append(common, args...)...)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		c.ExtraFiles = []*os.File{mem}
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return c, c.Start()
	}
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	for _, a := range []struct {
		mem  *os.File
		args []string
	}{
		{mems[0], []string{"-role", "daemon", "-peer", "listen:" + port}},
		{mems[1], []string{"-role", "daemon", "-peer", "dial:" + port}},
		{mems[1], []string{"-role", "trainer"}},
	} {
		p, err := start(a.mem, a.args...)
		if err != nil {
			return err
		}
		procs = append(procs, p)
	}
	lat, err := trainer(bell(int(mems[0].Fd())), true)
	if err != nil {
		return err
	}
	slices.Sort(lat)
	fmt.Printf("gosched=%v: median %.1f us, p90 %.1f us over %d round trips\n", *gosched,
		float64(lat[len(lat)/2].Nanoseconds())/1e3, float64(lat[len(lat)*9/10].Nanoseconds())/1e3, len(lat))
	return nil
}

func trainer(b doorbell, timed bool) ([]time.Duration, error) {
	var lat []time.Duration
	deadline := time.Now().Add(30 * time.Second)
	for k := uint32(1); k <= uint32(*iters); k++ {
		t0 := time.Now()
		atomic.StoreUint32(b.req, k)
		for atomic.LoadUint32(b.resp) != k {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("trainer: no answer to call %d within 30s", k)
			}
			yield()
		}
		if timed {
			lat = append(lat, time.Since(t0))
		}
	}
	return lat, nil
}

func daemon(b doorbell, peer string) error {
	var c net.Conn
	var err error
	deadline := time.Now().Add(30 * time.Second)
	switch {
	case len(peer) > 7 && peer[:7] == "listen:":
		var ln net.Listener
		if ln, err = net.Listen("tcp", "127.0.0.1:"+peer[7:]); err == nil {
			c, err = ln.Accept()
			ln.Close()
		}
	case len(peer) > 5 && peer[:5] == "dial:":
		for c, err = net.Dial("tcp", "127.0.0.1:"+peer[5:]); err != nil && time.Now().Before(deadline); c, err = net.Dial("tcp", "127.0.0.1:"+peer[5:]) {
			time.Sleep(10 * time.Millisecond)
		}
	default:
		err = fmt.Errorf("-peer %q: want listen:PORT or dial:PORT", peer)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetNoDelay(true)
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var msg, in [32]byte
	got := 0
	var rerr error
	poll := func(fd uintptr) {
		n, err := unix.Read(int(fd), in[got:])
		if n > 0 {
			got += n
		} else if err != unix.EAGAIN {
			rerr = fmt.Errorf("read from peer: %v (n=%d)", err, n)
		}
	}
	for k := uint32(1); k <= uint32(*iters); k++ {
		for atomic.LoadUint32(b.req) != k {
			if time.Now().After(deadline) {
				return fmt.Errorf("daemon: call %d never rang", k)
			}
			yield()
		}
		if _, err := c.Write(msg[:]); err != nil {
			return err
		}
		for got = 0; got < len(in); {
			if err := rc.Control(poll); err != nil {
				return err
			}
			if rerr != nil {
				return rerr
			}
			if got < len(in) {
				yield()
			}
		}
		atomic.StoreUint32(b.resp, k)
		deadline = time.Now().Add(30 * time.Second)
	}
	return nil
}
