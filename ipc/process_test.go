package ipc

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The child side of the cross-process tests: the test binary re-executed
// with IPC_TEST_CHILD set runs only TestChildProcess, which acts as a
// client in its own process (own pid, own fd table, maybe another uid).
const childEnv = "IPC_TEST_CHILD"

func TestChildProcess(t *testing.T) {
	mode := os.Getenv(childEnv)
	if mode == "" {
		t.Skip("only runs as a child of the cross-process tests")
	}
	path := os.Getenv("IPC_TEST_SOCKET")
	c := dial(t, path)
	switch mode {
	case "client":
		c.attach()
		// Daemon-made segment: fd received across the process boundary.
		seg, mem := c.alloc(3 * 4096)
		for i := range mem {
			mem[i] = 7
		}
		f := c.roundTrip((&Call{Desc: descInt32(1024, "x"), SHM: true, Segment: seg.Segment, Offset: 4096}).Encode(c.id()), -1)
		if f.Type != TypeCallOK || mem[4095] != 7 || mem[4096] != 8 || mem[8191] != 8 || mem[8192] != 7 {
			t.Fatalf("shm call: %s %v", f.Type, c.errorOf(f))
		}
		// Client-made segment: fd sent across the process boundary.
		fd := memfd(t, 4096, unix.F_SEAL_SHRINK)
		rm, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		f = c.roundTrip(Register{Size: 4096}.Encode(c.id()), fd)
		unix.Close(fd)
		reg, err := DecodeRegisterOK(f.Payload)
		if f.Type != TypeRegisterOK || err != nil {
			t.Fatalf("REGISTER: %s %v", f.Type, c.errorOf(f))
		}
		f = c.roundTrip((&Call{Desc: descInt32(1024, ""), SHM: true, Segment: reg.Segment}).Encode(c.id()), -1)
		if f.Type != TypeCallOK || rm[0] != 1 || rm[4095] != 1 {
			t.Fatalf("call on registered memfd: %s", f.Type)
		}
		// A pipe is refused by a daemon in another process too.
		r, w := pipeFds(t)
		c.expectError(c.roundTrip(Register{Size: 4096}.Encode(c.id()), r), CodeBadFD, false, "not a memfd")
		unix.Close(r)
		unix.Close(w)
		fmt.Printf("CHILD OK pid=%d\n", os.Getpid())
	case "denied":
		e := c.errorOf(c.read())
		if e == nil {
			t.Fatal("no ERROR")
		}
		fmt.Printf("CHILD DENIED code=%s fatal=%v uid=%d msg=%s\n", e.Code, e.Fatal, os.Getuid(), e.Message)
		c.expectClosed()
	default:
		t.Fatalf("unknown child mode %q", mode)
	}
}

// runChild runs the test binary as a client; cred, if set, runs it as
// another user.
func runChild(t *testing.T, bin, mode, socket string, cred *syscall.Credential) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^TestChildProcess$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "IPC_TEST_SOCKET="+socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", mode, err, out)
	}
	return string(out), cmd.Process.Pid
}

func TestCrossProcessClient(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("child")
	}
	srv, h := startServer(t, nil)
	base := openFds(t)
	out, pid := runChild(t, os.Args[0], "client", srv.Path(), nil)
	if !strings.Contains(out, fmt.Sprintf("CHILD OK pid=%d", pid)) {
		t.Fatalf("child output:\n%s", out)
	}
	ev := h.waitGone(t)
	if ev.s.PID() != int32(pid) || ev.s.UID() != uint32(os.Getuid()) {
		t.Errorf("session saw pid %d uid %d, child is pid %d uid %d", ev.s.PID(), ev.s.UID(), pid, os.Getuid())
	}
	waitFds(t, base)
}

// A peer whose uid is not allowed gets PERMISSION naming it. The child
// runs as nobody (65534), so it needs root to start and a copy of the test
// binary and a socket it can reach.
func TestCrossProcessPermissionDenied(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("child")
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to run a child as another uid")
	}
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "ipc.test")
	copyFile(t, os.Args[0], bin)
	socket := filepath.Join(dir, "d.sock")
	srv, h := startServer(t, func(c *ServerConfig) {
		c.Path = socket
		c.Mode = 0o666
		c.AllowedUIDs = []uint32{1234}
		c.AllowedGIDs = []uint32{4321}
	})
	out, _ := runChild(t, bin, "denied", srv.Path(), &syscall.Credential{Uid: 65534, Gid: 65534})
	if !strings.Contains(out, "CHILD DENIED code=PERMISSION fatal=true uid=65534 msg=uid 65534 / gid 65534 may not use this daemon") {
		t.Fatalf("child output:\n%s", out)
	}
	select {
	case ev := <-h.gone:
		t.Errorf("handler told of a refused peer: %v", ev.cause)
	default:
	}
	// Allowed by gid: the same child is admitted.
	h2srv, _ := startServer(t, func(c *ServerConfig) {
		c.Path = filepath.Join(dir, "d2.sock")
		c.Mode = 0o666
		c.AllowedGIDs = []uint32{65534}
	})
	out, _ = runChild(t, bin, "client", h2srv.Path(), &syscall.Credential{Uid: 65534, Gid: 65534})
	if !strings.Contains(out, "CHILD OK") {
		t.Fatalf("child allowed by gid:\n%s", out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
