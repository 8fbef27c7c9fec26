package e2e

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/ipc"
)

// rawClient speaks the protocol byte by byte, to send what no client would.
type rawClient struct {
	t  *testing.T
	uc *net.UnixConn
}

func dialRaw(t *testing.T, path string) *rawClient {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, uc: c.(*net.UnixConn)}
}

func (r *rawClient) hello() {
	r.t.Helper()
	r.send(ipc.Hello{Version: ipc.Version, LocalRank: -1, PID: uint32(os.Getpid()), Job: "e2e", Label: "raw"}.Encode(1), -1)
	typ, _, _ := r.read()
	if typ != ipc.TypeHelloOK {
		r.t.Fatalf("HELLO answered with %s", typ)
	}
}

func (r *rawClient) send(b []byte, fd int) {
	r.t.Helper()
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := r.uc.WriteMsgUnix(b, oob, nil); err != nil {
		r.t.Fatalf("send: %v", err)
	}
}

// read returns the next frame's type, flags and payload.
func (r *rawClient) read() (ipc.Type, uint8, []byte) {
	r.t.Helper()
	r.uc.SetReadDeadline(time.Now().Add(5 * time.Second))
	var h [ipc.HeaderSize]byte
	if _, err := io.ReadFull(r.uc, h[:]); err != nil {
		r.t.Fatalf("read header: %v", err)
	}
	n := binary.LittleEndian.Uint32(h[:])
	if n > 1<<20 {
		r.t.Fatalf("daemon sent a %d-byte payload", n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r.uc, p); err != nil {
		r.t.Fatalf("read payload: %v", err)
	}
	return ipc.Type(h[4]), h[5], p
}

// expectError reads an ERROR frame with the given code whose message says
// want, and, if fatal, then the connection's end.
func (r *rawClient) expectError(code ipc.Code, want string, fatal bool) {
	r.t.Helper()
	typ, flags, p := r.read()
	if typ != ipc.TypeError {
		r.t.Fatalf("got %s, want ERROR %s", typ, code)
	}
	e, err := ipc.DecodeError(flags, p)
	if err != nil {
		r.t.Fatal(err)
	}
	if e.Code != code || !strings.Contains(e.Message, want) || e.Fatal != fatal {
		r.t.Fatalf("got %v (fatal=%v), want %s saying %q (fatal=%v)", e, e.Fatal, code, want, fatal)
	}
	if fatal {
		r.uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		if _, err := r.uc.Read(b[:]); !errors.Is(err, io.EOF) {
			r.t.Fatalf("after a fatal error the daemon should close; read gave %v", err)
		}
	}
}

// fdsPerSession is what one admitted trainer's connection costs a daemon
// that polls (the default ring.spin): its socket and the duplicate it
// reads through (ipc.Conn.EnableRearm).
const fdsPerSession = 2

// TestBadClientsWhileTrainersRun: while a 2x1 world allreduces, bad
// clients connect to daemon 0 and are refused with named errors; the
// trainers' results are unaffected. On a second daemon, a pipe and an
// unsealed memfd offered as segments are refused and closed at once (its
// fd count is its baseline plus the still-open connection), and an fd
// sent with a CALL is closed with the connection.
func TestBadClientsWhileTrainersRun(t *testing.T) {
	w := startWorld(t, 2, 1, "")
	sock := w.sockets[0]
	trs := w.startTrainers("-mode", "sweep", "-sizes", "4,65536,1048588", "-paths", "inline,shm")

	t.Run("garbage", func(t *testing.T) {
		r := dialRaw(t, sock)
		r.send([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), -1)
		r.expectError(ipc.CodeBadFrame, "", true)
	})
	t.Run("oversized length", func(t *testing.T) {
		r := dialRaw(t, sock)
		h := ipc.Header{Length: 0xffffffff, Type: ipc.TypeHello, ID: 1}
		var b [ipc.HeaderSize]byte
		h.Put(b[:])
		r.send(b[:], -1)
		r.expectError(ipc.CodeBadFrame, "4294967295", true)
	})
	t.Run("other version", func(t *testing.T) {
		r := dialRaw(t, sock)
		r.send(ipc.Hello{Version: 9, LocalRank: -1, Job: "e2e"}.Encode(1), -1)
		r.expectError(ipc.CodeVersion, "version 9", true)
	})
	t.Run("other job", func(t *testing.T) {
		r := dialRaw(t, sock)
		r.send(ipc.Hello{Version: ipc.Version, LocalRank: -1, Job: "stranger"}.Encode(1), -1)
		r.expectError(ipc.CodeJob, "stranger", true)
	})
	// The remaining cases need a free local rank on node 0, which the
	// trainer holds: use node 0 of a world of one of their own.
	w1 := startWorld(t, 1, 4, "")
	sock1 := w1.sockets[0]
	base := stableProc(t, sock1)
	t.Run("pipe as segment", func(t *testing.T) {
		r := dialRaw(t, sock1)
		r.hello()
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		r.send(ipc.Register{Size: 4096}.Encode(2), p[0])
		r.expectError(ipc.CodeBadFD, "not a memfd", false)
		expectProc(t, sock1, base.FDs+fdsPerSession, base.Memfds, "the pipe refused, its connection open")
	})
	t.Run("unsealed memfd", func(t *testing.T) {
		r := dialRaw(t, sock1)
		r.hello()
		fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		unix.Ftruncate(fd, 4096)
		r.send(ipc.Register{Size: 4096}.Encode(2), fd)
		r.expectError(ipc.CodeBadFD, "SEAL_SHRINK", false)
		expectProc(t, sock1, base.FDs+fdsPerSession, base.Memfds, "the unsealed memfd refused, its connection open")
	})
	t.Run("fd on a CALL", func(t *testing.T) {
		r := dialRaw(t, sock1)
		r.hello()
		fd, err := unix.Open("/dev/zero", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		call := ipc.Call{}
		call.Desc.Op = 4 // barrier
		r.send(call.Encode(2), fd)
		r.expectError(ipc.CodeBadFD, "", true)
		expectProc(t, sock1, base.FDs, base.Memfds, "the CALL with an fd refused and its connection closed")
	})

	checkSameResults(t, trs, 4*4*3*2)
	// A well-behaved client still works on the daemon the bad ones hit.
	trs1 := w1.startTrainers("-mode", "repeat", "-times", "2", "-count", "100")
	for _, tr := range trs1 {
		if evs, err := tr.wait(t, 30*time.Second); err != nil || len(evs) != 2 || !evs[1].OK {
			t.Fatalf("trainer after the bad clients: %v %+v", err, evs)
		}
	}
}

// TestSocketPermissions: the socket is created with the configured mode,
// and a process whose uid is not allowed is refused with PERMISSION.
func TestSocketPermissions(t *testing.T) {
	w := startWorld(t, 1, 1, fastTimeouts+"socket:\n  mode: \"0666\"\n  allowed_uids: [0]\n")
	st, err := os.Stat(w.sockets[0])
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode %v, want socket with 0666", st.Mode())
	}
	w0 := startWorld(t, 1, 1, "")
	if st, err := os.Stat(w0.sockets[0]); err != nil || st.Mode().Perm() != 0o660 {
		t.Fatalf("default socket mode %v (%v), want 0660", st.Mode().Perm(), err)
	}
	if os.Getuid() != 0 {
		t.Skip("needs root to run a client as another uid")
	}
	// The trainer, run as nobody, must reach the socket file to be
	// refused by the daemon rather than by the file system.
	os.Chmod(w.dir, 0o755)
	os.Chmod(trainerBin, 0o755)
	os.Chmod(strings.TrimSuffix(trainerBin, "/trainer"), 0o755)
	cmd := exec.Command(trainerBin, "-socket", w.sockets[0], "-job", "e2e", "-mode", "repeat", "-times", "1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("a client with uid 65534 was accepted: %s", out)
	}
	if !strings.Contains(string(out), "PERMISSION") || !strings.Contains(string(out), "65534") {
		t.Fatalf("refusal does not say PERMISSION for uid 65534: %s", out)
	}
}

// stableProc returns a daemon's resource use once two readings 200 ms
// apart agree on fds and memfds. Each reading is taken through an observer
// connection of its own, so every reading counts one connection of ours.
func stableProc(t *testing.T, sock string) procStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var prev procStatus
	for i := 0; ; i++ {
		st, err := clusterStatus(sock)
		if err == nil && i > 0 && st.Process.FDs == prev.FDs && st.Process.Memfds == prev.Memfds {
			return st.Process
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon at %s: resource use never settled: %+v then %+v (%v)", sock, prev, st.Process, err)
		}
		prev = st.Process
		time.Sleep(200 * time.Millisecond)
	}
}

// expectProc waits (bounded) until the daemon at sock holds fds open fds
// and memfds memfds, as counted from an observer's connection like
// stableProc's: a refused fd the daemon kept open shows as one too many.
func expectProc(t *testing.T, sock string, fds, memfds int, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := clusterStatus(sock)
		if err == nil && st.Process.FDs == fds && st.Process.Memfds == memfds {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: daemon holds %d fds and %d memfds, want %d and %d (status error %v)",
				when, st.Process.FDs, st.Process.Memfds, fds, memfds, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
