package ipc

import (
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/internal/fdtest"
	"github.com/collectived/collectived/internal/syncbuf"
)

// A daemon out of fds cannot accept: it logs why and retries, the trainer
// already attached goes on being served, and the connection waiting in
// the backlog is accepted and attaches once fds are free again.
func TestAcceptOutOfFDs(t *testing.T) {
	srv, logs := serverWithLogs(t, nil)
	attached := dial(t, srv.Path())
	attached.attach()

	const retrying = "accept failed; retrying"
	var status Frame
	nc, err := fdtest.ConnectWhileFull("unix", srv.Path(), func() bool {
		if !strings.Contains(logs.String(), retrying) {
			return false
		}
		status = attached.roundTrip(AppendEmpty(nil, TypeStatus, attached.id()), -1)
		return true
	}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if log := logs.String(); !strings.Contains(log, retrying) || !strings.Contains(log, "too many open files") {
		nc.Close()
		t.Fatalf("no accept failure naming the cause in the log within 10s:\n%s", log)
	}
	if status.Type != TypeStatusOK {
		nc.Close()
		t.Fatalf("the attached trainer's STATUS while the daemon was out of fds: %s (%v), want STATUS_OK", status.Type, attached.errorOf(status))
	}

	uc := nc.(*net.UnixConn)
	uc.SetReadDeadline(time.Now().Add(20 * time.Second))
	waiting := &client{t: t, uc: uc, c: NewConn(uc, ClientSide), next: 1}
	t.Cleanup(func() { waiting.c.Close() })
	waiting.attach()
}

// A REGISTER whose fd the daemon could not receive (it is out of fds; the
// kernel truncates the control message) fails by itself, naming that,
// not the client: the connection goes on, and the same REGISTER succeeds
// once fds are free. A client that sends too many fds is still refused
// as such (TestStrayFdsAreFatal, "200 fds").
func TestRegisterWhileDaemonOutOfFDs(t *testing.T) {
	srv, logs := serverWithLogs(t, nil)
	c := dial(t, srv.Path())
	c.attach()
	fd := memfd(t, 8192, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	defer unix.Close(fd)

	release, err := fdtest.Exhaust()
	if err != nil {
		t.Fatal(err)
	}
	c.send(Register{Size: 8192}.Encode(c.id()), fd)
	f := c.read()
	release()
	c.expectError(f, CodeBadFD, false, "REGISTER: the daemon could not receive the segment's fd (the daemon is out of file descriptors, its limit ")
	if log := logs.String(); !strings.Contains(log, "out of file descriptors") || !strings.Contains(log, "rlimit_nofile=") {
		t.Fatalf("the daemon's log does not say it ran out of fds:\n%s", log)
	}

	f = c.roundTrip(Register{Size: 8192}.Encode(c.id()), fd)
	if f.Type != TypeRegisterOK {
		t.Fatalf("REGISTER once fds are free: %s (%v), want REGISTER_OK", f.Type, c.errorOf(f))
	}
}

// A client out of fds cannot receive ALLOC_OK's fd: its read fails with
// an error saying so (not that the daemon sent too many), as it must, for
// the daemon's segment is then left behind.
func TestAllocOKWhileClientOutOfFDs(t *testing.T) {
	daemon, cl := sidesPair(t)
	fd := memfd(t, 4096, 0)
	defer unix.Close(fd)
	if err := daemon.WriteFrame(AllocOK{Segment: 1, Size: 4096}.Encode(2), fd); err != nil {
		t.Fatal(err)
	}
	release, err := fdtest.Exhaust()
	if err != nil {
		t.Fatal(err)
	}
	_, err = cl.ReadFrame()
	release()
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeBadFD || !strings.Contains(e.Message, "ALLOC_OK (id 2): its fd could not be received: this process is out of file descriptors") {
		t.Fatalf("ReadFrame of ALLOC_OK while out of fds: %v, want BAD_FD saying this process is out of file descriptors", err)
	}
}

// ALLOC and LANE on a daemon out of fds fail by themselves (not fatal),
// saying the daemon is out of file descriptors and what its limit is;
// the same requests succeed once fds are free.
func TestAllocAndLaneWhileDaemonOutOfFDs(t *testing.T) {
	srv, logs := serverWithLogs(t, nil)
	c := dial(t, srv.Path())
	c.attachV2()

	release, err := fdtest.Exhaust()
	if err != nil {
		t.Fatal(err)
	}
	c.send(Alloc{Size: 4096}.Encode(c.id()), -1)
	alloc := c.errorOf(c.read()) // decoded now: a frame's payload lasts until the next read
	c.send(AppendEmpty(nil, TypeLane, c.id()), -1)
	lane := c.errorOf(c.read())
	release()
	for _, e := range []struct {
		got  *Error
		want string
	}{
		{alloc, "ALLOC of 4096 bytes (the daemon is out of file descriptors, its limit "},
		{lane, "LANE (the daemon is out of file descriptors, its limit "},
	} {
		if e.got == nil || e.got.Code != CodeInternal || e.got.Fatal || !strings.Contains(e.got.Message, e.want) {
			t.Fatalf("got %v, want INTERNAL, not fatal, containing %q", e.got, e.want)
		}
	}
	if log := logs.String(); !strings.Contains(log, "this daemon is out of file descriptors") || !strings.Contains(log, "rlimit_nofile=") {
		t.Fatalf("the daemon's log does not say it ran out of fds:\n%s", log)
	}

	if f := c.roundTrip(Alloc{Size: 4096}.Encode(c.id()), -1); f.Type != TypeAllocOK {
		t.Fatalf("ALLOC once fds are free: %s (%v)", f.Type, c.errorOf(f))
	} else {
		unix.Close(f.FD)
	}
	if f := c.roundTrip(AppendEmpty(nil, TypeLane, c.id()), -1); f.Type != TypeLaneOK {
		t.Fatalf("LANE once fds are free: %s (%v)", f.Type, c.errorOf(f))
	} else {
		unix.Close(f.FD)
	}
}

// serverWithLogs is startServer with a log the test reads; mut, if not
// nil, adjusts the config further.
func serverWithLogs(t *testing.T, mut func(*ServerConfig)) (*Server, *syncbuf.Buffer) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	srv, _ := startServer(t, func(c *ServerConfig) {
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
		if mut != nil {
			mut(c)
		}
	})
	return srv, logs
}

// sidesPair is a daemon-side and a client-side Conn on the two ends of a
// Unix socket, closed when the test ends.
func sidesPair(t *testing.T) (daemon, client *Conn) {
	t.Helper()
	ua, ub, err := unixPair(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	daemon, client = NewConn(ua, DaemonSide), NewConn(ub, ClientSide)
	t.Cleanup(func() { daemon.Close(); client.Close() })
	return daemon, client
}

// An ALLOC the daemon cannot map (here bigger than the address space,
// within a quota set that high) fails by itself, its message saying the
// daemon could not map it and why that may be; the connection goes on.
func TestAllocTheDaemonCannotMap(t *testing.T) {
	srv, logs := serverWithLogs(t, func(c *ServerConfig) { c.ShmQuota = 1 << 62 })
	c := dial(t, srv.Path())
	c.attach()
	c.expectError(c.roundTrip(Alloc{Size: 1 << 47}.Encode(c.id()), -1), CodeInternal, false,
		"(the daemon could not map it: out of memory, or vm.max_map_count reached)")
	if !strings.Contains(logs.String(), "could not map a segment") {
		t.Fatalf("the daemon's log does not say it could not map a segment:\n%s", logs.String())
	}
	if f := c.roundTrip(Alloc{Size: 4096}.Encode(c.id()), -1); f.Type != TypeAllocOK {
		t.Fatalf("ALLOC after the failed one: %s (%v)", f.Type, c.errorOf(f))
	} else {
		unix.Close(f.FD)
	}
}

// Losses the daemon notes while out of fds are forgotten once read past:
// a client attaching fds to frames that carry none (a stray fd, fatal
// when it arrives) while none can be received leaves no growing list
// behind, and its frames are read in order.
func TestLostFDsAreForgotten(t *testing.T) {
	daemon, cl := sidesPair(t)
	fd := memfd(t, 4096, 0)
	defer unix.Close(fd)
	release, err := fdtest.Exhaust()
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	const frames = 200
	longest := 0
	for i := range frames {
		if err := cl.WriteFrame(AppendEmpty(nil, TypeStatus, uint64(i+1)), fd); err != nil {
			t.Fatal(err)
		}
		f, err := daemon.ReadFrame()
		if err != nil || f.ID != uint64(i+1) {
			t.Fatalf("frame %d: id %d, %v", i+1, f.ID, err)
		}
		longest = max(longest, len(daemon.lost))
	}
	if longest > 1 {
		t.Fatalf("%d losses remembered at once over %d frames read one by one, want at most 1", longest, frames)
	}
}
