package ipc

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/collectived/collectived/collective"
)

// testHandler is a small core: it admits up to localSize trainers of job
// "job", answers inline and shared-memory calls by adding 1 to every byte
// of the buffer (or holds them while hold is set), and fails calls named
// "fail" with MISMATCH and "boom" with a plain error.
type testHandler struct {
	localSize int

	mu     sync.Mutex
	ranks  map[int]*Session
	hold   bool
	inline bool // answer inside Call, without a goroutine
	held   []*Request
	pids   []int32
	seq    atomic.Uint64
	gone   chan goneEvent
	status []byte
	// onPark, if set, hears each time a trainer session's reader parks
	// (Session.SetOnPark).
	onPark chan struct{}
}

type goneEvent struct {
	s     *Session
	cause error
}

func newTestHandler() *testHandler {
	return &testHandler{localSize: 4, ranks: map[int]*Session{}, gone: make(chan goneEvent, 64)}
}

func (h *testHandler) Hello(s *Session, m Hello) (HelloOK, error) {
	if m.Job != "job" {
		return HelloOK{}, Errorf(CodeJob, "HELLO names job %q, daemon serves job %q", m.Job, "job")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pids = append(h.pids, s.PID())
	ok := HelloOK{WorldSize: uint32(h.localSize), NodeCount: 1, LocalSize: uint32(h.localSize), Generation: 1, TimeoutMS: 60000,
		FirstCallTimeoutMS: 600000}
	if m.Observer {
		return ok, nil
	}
	rank := int(m.LocalRank)
	if rank == -1 {
		for rank = 0; rank < h.localSize && h.ranks[rank] != nil; rank++ {
		}
		if rank == h.localSize {
			return HelloOK{}, Errorf(CodeFull, "all %d local ranks are taken", h.localSize)
		}
	}
	if rank >= h.localSize {
		return HelloOK{}, Errorf(CodeRankRange, "local rank %d outside [0, %d)", rank, h.localSize)
	}
	if o := h.ranks[rank]; o != nil {
		return HelloOK{}, Errorf(CodeRankTaken, "local rank %d is held by pid %d", rank, o.PID())
	}
	h.ranks[rank] = s
	s.SetValue(rank)
	if parked := h.onPark; parked != nil {
		s.SetOnPark(func() {
			select {
			case parked <- struct{}{}:
			default:
			}
		})
	}
	ok.LocalRank, ok.WorldRank = uint32(rank), uint32(rank)
	return ok, nil
}

func (h *testHandler) Call(s *Session, r *Request) {
	h.mu.Lock()
	if h.hold {
		h.held = append(h.held, r)
		h.mu.Unlock()
		return
	}
	inline := h.inline
	h.mu.Unlock()
	if inline {
		h.answer(r)
		return
	}
	go h.answer(r)
}

func (h *testHandler) answer(r *Request) {
	switch r.Desc.Name {
	case "fail":
		r.Fail(Errorf(CodeMismatch, "world rank 1 disagrees"))
		return
	case "boom":
		r.Fail(errors.New("core exploded"))
		return
	}
	for i := range r.Buf {
		r.Buf[i]++
	}
	r.Reply(1, h.seq.Add(1)-1)
}

// release answers every held call and stops holding.
func (h *testHandler) release() {
	h.mu.Lock()
	held := h.held
	h.held, h.hold = nil, false
	h.mu.Unlock()
	for _, r := range held {
		h.answer(r)
	}
}

func (h *testHandler) setHold() {
	h.mu.Lock()
	h.hold = true
	h.mu.Unlock()
}

func (h *testHandler) Status() ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.status != nil {
		return h.status, nil
	}
	return json.Marshal(map[string]any{"job": "job", "trainers": len(h.ranks)})
}

func (h *testHandler) Disconnected(s *Session, cause error) {
	h.mu.Lock()
	if v, ok := s.Value().(int); ok && h.ranks[v] == s {
		delete(h.ranks, v)
	}
	h.mu.Unlock()
	h.gone <- goneEvent{s, cause}
}

// waitGone waits for one Disconnected call.
func (h *testHandler) waitGone(t *testing.T) goneEvent {
	t.Helper()
	select {
	case ev := <-h.gone:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no Disconnected within 10s")
	}
	return goneEvent{}
}

// startServer runs a server with cfg adjusted for tests; it is closed when
// the test ends.
func startServer(t *testing.T, mut func(*ServerConfig)) (*Server, *testHandler) {
	t.Helper()
	cfg := DefaultServerConfig()
	cfg.Path = filepath.Join(t.TempDir(), "d.sock")
	cfg.HelloTimeout = 5 * time.Second
	cfg.InlineLimit = 4096
	cfg.MaxInFlight = 8
	cfg.ShmQuota = 16 << 20
	if mut != nil {
		mut(&cfg)
	}
	srv, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := newTestHandler()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(h) }()
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return srv, h
}

// client is a minimal protocol client for tests, on the package's Conn.
type client struct {
	t    testing.TB
	uc   *net.UnixConn
	c    *Conn
	ok   HelloOK
	next uint64
}

func dial(t testing.TB, path string) *client {
	t.Helper()
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, uc: uc, c: NewConn(uc, ClientSide), next: 1}
	c.uc.SetReadDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { c.c.Close() })
	return c
}

func (c *client) id() uint64 { c.next++; return c.next }

// attach sends HELLO for job "job" and any rank and expects HELLO_OK.
func (c *client) attach() HelloOK {
	c.t.Helper()
	f := c.roundTrip(Hello{Version: 1, LocalRank: -1, PID: uint32(os.Getpid()), Job: "job", Label: "test"}.Encode(1), -1)
	if f.Type != TypeHelloOK {
		c.t.Fatalf("HELLO answered with %s: %v", f.Type, c.errorOf(f))
	}
	ok, err := DecodeHelloOK(f.Payload)
	if err != nil {
		c.t.Fatal(err)
	}
	c.ok = ok
	c.c.SetMaxFrame(ok.MaxFrame)
	return ok
}

func (c *client) send(b []byte, fd int) {
	c.t.Helper()
	if err := c.c.WriteFrame(b, fd); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *client) read() Frame {
	c.t.Helper()
	f, err := c.c.ReadFrame()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f
}

func (c *client) roundTrip(b []byte, fd int) Frame {
	c.t.Helper()
	c.send(b, fd)
	return c.read()
}

func (c *client) errorOf(f Frame) *Error {
	if f.Type != TypeError {
		return nil
	}
	e, err := DecodeError(f.Flags, f.Payload)
	if err != nil {
		c.t.Fatalf("bad ERROR frame: %v", err)
	}
	return e
}

// expectError checks that f is an ERROR with code, fatality and a message
// containing want; a fatal one must be followed by the connection closing.
func (c *client) expectError(f Frame, code Code, fatal bool, want string) {
	c.t.Helper()
	e := c.errorOf(f)
	if e == nil {
		c.t.Fatalf("got %s, want ERROR %s %q", f.Type, code, want)
	}
	if e.Code != code || e.Fatal != fatal || !strings.Contains(e.Message, want) {
		c.t.Fatalf("got %v, want %s fatal=%v containing %q", e, code, fatal, want)
	}
	if fatal {
		c.expectClosed()
	}
}

func (c *client) expectClosed() {
	c.t.Helper()
	if f, err := c.c.ReadFrame(); err == nil {
		c.t.Fatalf("connection still open: read %s", f.Type)
	} else if !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "EOF") && !strings.Contains(err.Error(), "reset") {
		c.t.Fatalf("connection not closed by the daemon: %v", err)
	}
}

// inlineCall sends an allreduce(bytes...) style call; with dtype Int32 sum.
func (c *client) inlineCall(id uint64, data []byte, name string) Frame {
	c.t.Helper()
	call := Call{Desc: descInt32(uint64(len(data)/4), name), Data: data}
	return c.roundTrip(call.Encode(id), -1)
}

// replyWithFD sends req and expects its reply of type want, with an fd,
// which the caller closes.
func (c *client) replyWithFD(req []byte, want Type) Frame {
	c.t.Helper()
	f := c.roundTrip(req, -1)
	if f.Type != want {
		c.t.Fatalf("%s answered %s: %v", frameType(req), f.Type, c.errorOf(f))
	}
	if f.FD < 0 {
		c.t.Fatalf("%s without fd", want)
	}
	return f
}

func (c *client) alloc(size uint64) (AllocOK, []byte) {
	c.t.Helper()
	f := c.replyWithFD(Alloc{Size: size}.Encode(c.id()), TypeAllocOK)
	defer unix.Close(f.FD)
	m, err := DecodeAllocOK(f.Payload)
	if err != nil {
		c.t.Fatal(err)
	}
	mem, err := unix.Mmap(f.FD, 0, int(m.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { unix.Munmap(mem) })
	return m, mem
}

func openFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// waitFds waits until the process has want fds open (sessions close theirs
// asynchronously).
func waitFds(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := openFds(t)
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d fds open, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func memfd(t testing.TB, size int64, seals int) int {
	t.Helper()
	fd, err := unix.MemfdCreate("client", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatal(err)
		}
	}
	return fd
}

func descInt32(count uint64, name string) collective.Desc {
	return collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: count, Name: name}
}
