package ipc

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func pipeFds(t *testing.T) (int, int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	return p[0], p[1]
}

func TestAllocFdIsCloseOnExec(t *testing.T) {
	srv, _ := startServer(t, nil)
	c := dial(t, srv.Path())
	c.attach()
	f := c.roundTrip(Alloc{Size: 1}.Encode(2), -1)
	if f.Type != TypeAllocOK || f.FD < 0 {
		t.Fatalf("ALLOC: %s fd %d", f.Type, f.FD)
	}
	defer unix.Close(f.FD)
	flags, err := unix.FcntlInt(uintptr(f.FD), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("received fd flags %#x, %v: not close-on-exec (MSG_CMSG_CLOEXEC)", flags, err)
	}
	seals, err := unix.FcntlInt(uintptr(f.FD), unix.F_GET_SEALS, 0)
	if want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL; err != nil || seals != want {
		t.Errorf("seals %#x, %v; want %#x", seals, err, want)
	}
	if err := unix.Ftruncate(f.FD, 0); err == nil {
		t.Error("client could truncate the daemon's segment")
	}
}

// Refused fds are closed by the daemon and the connection goes on; the
// process's fd count comes back to where it was.
func TestRegisterRefusesBadFds(t *testing.T) {
	srv, h := startServer(t, nil)
	base := openFds(t)
	c := dial(t, srv.Path())
	c.attach()

	r, w := pipeFds(t)
	zero, err := unix.Open("/dev/zero", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	reg, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		fd   int
		size uint64
		want string
	}{
		{"pipe", r, 4096, "not a memfd"},
		{"/dev/zero", zero, 4096, "/dev/zero"},
		{"regular file", reg, 4096, "not a memfd"},
		{"unsealed memfd", memfd(t, 4096, 0), 4096, "not sealed with F_SEAL_SHRINK"},
		{"wrong size", memfd(t, 4096, unix.F_SEAL_SHRINK), 8192, "memfd has 4096 bytes, client said 8192"},
	}
	for _, tc := range cases {
		c.expectError(c.roundTrip(Register{Size: tc.size}.Encode(c.id()), tc.fd), CodeBadFD, false, tc.want)
		unix.Close(tc.fd)
		if f := c.inlineCall(c.id(), make([]byte, 4), ""); f.Type != TypeCallOK {
			t.Fatalf("after %s: %s", tc.name, f.Type)
		}
	}
	unix.Close(w)
	fd := memfd(t, 4096, unix.F_SEAL_SHRINK)
	c.expectError(c.roundTrip(Register{}.Encode(c.id()), fd), CodeBadRequest, false, "REGISTER: size is 0")
	unix.Close(fd)
	c.c.Close()
	h.waitGone(t)
	waitFds(t, base)
}

// Fds where the protocol has none are fatal BAD_FD, answered to the frame
// that came with them (its id), which is not acted on; another client goes
// on, and every fd the daemon received is closed. A truncated control
// message cannot be laid at one frame's door: its ERROR has id 0.
func TestStrayFdsAreFatal(t *testing.T) {
	srv, h := startServer(t, nil)
	other := dial(t, srv.Path())
	other.attach()
	base := openFds(t)

	cases := []struct {
		name string
		run  func(c *client) Frame
		want string
	}{
		{"fd on CALL", func(c *client) Frame {
			fd := memfd(t, 4096, unix.F_SEAL_SHRINK)
			defer unix.Close(fd)
			return c.roundTrip((&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Encode(5), fd)
		}, "CALL (id 5) arrived with 1 fd(s) and carries none: only REGISTER carry one"},
		{"fd on HELLO", func(c *client) Frame {
			fd := memfd(t, 4096, unix.F_SEAL_SHRINK)
			defer unix.Close(fd)
			return c.roundTrip(Hello{Version: 1, LocalRank: -1, Job: "job"}.Encode(5), fd)
		}, "HELLO (id 5) arrived with 1 fd(s) and carries none"},
		{"REGISTER without fd", func(c *client) Frame {
			return c.roundTrip(Register{Size: 4096}.Encode(5), -1)
		}, "REGISTER (id 5) arrived without an fd"},
		{"two fds on REGISTER", func(c *client) Frame {
			a, b := memfd(t, 4096, unix.F_SEAL_SHRINK), memfd(t, 4096, unix.F_SEAL_SHRINK)
			defer unix.Close(a)
			defer unix.Close(b)
			if _, _, err := c.uc.WriteMsgUnix(Register{Size: 4096}.Encode(5), unix.UnixRights(a, b), nil); err != nil {
				t.Fatal(err)
			}
			return c.read()
		}, "REGISTER (id 5) arrived with 2 fds; it carries exactly one"},
		{"REGISTER and a stray fd in two sendmsgs", func(c *client) Frame {
			a, b := memfd(t, 4096, unix.F_SEAL_SHRINK), memfd(t, 4096, unix.F_SEAL_SHRINK)
			defer unix.Close(a)
			defer unix.Close(b)
			reg := Register{Size: 4096}.Encode(5)
			if _, _, err := c.uc.WriteMsgUnix(reg[:HeaderSize], unix.UnixRights(a), nil); err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.uc.WriteMsgUnix(reg[HeaderSize:], unix.UnixRights(b), nil); err != nil {
				t.Fatal(err)
			}
			return c.read()
		}, "REGISTER (id 5) arrived with 2 fds; it carries exactly one"},
		{"200 fds (MSG_CTRUNC)", func(c *client) Frame {
			fds := make([]int, 200)
			for i := range fds {
				fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				fds[i] = fd
			}
			defer func() {
				for _, fd := range fds {
					unix.Close(fd)
				}
			}()
			if _, _, err := c.uc.WriteMsgUnix(Register{Size: 4096}.Encode(5), unix.UnixRights(fds...), nil); err != nil {
				t.Fatal(err)
			}
			return c.read()
		}, "MSG_CTRUNC"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := dial(t, srv.Path())
			if tc.name != "fd on HELLO" {
				c.attach()
			}
			f := tc.run(c)
			if want := uint64(5); f.ID != want && tc.name != "200 fds (MSG_CTRUNC)" {
				t.Errorf("ERROR carries id %d, want the frame's %d", f.ID, want)
			}
			c.expectError(f, CodeBadFD, true, tc.want)
			c.c.Close()
			if tc.name != "fd on HELLO" { // never admitted
				h.waitGone(t)
			}
			waitFds(t, base)
			if f := other.inlineCall(other.id(), make([]byte, 4), ""); f.Type != TypeCallOK {
				t.Fatalf("other client: %s", f.Type)
			}
		})
	}
}

// Pipelined requests: the replies (some with fds) arrive back to back and
// are read in large chunks; every ALLOC_OK still gets its own fd, in order.
func TestPipelinedAllocsPairFds(t *testing.T) {
	srv, _ := startServer(t, nil)
	base := openFds(t)
	c := dial(t, srv.Path())
	c.attach()
	var batch []byte
	for i := uint64(1); i <= 6; i++ {
		batch = Alloc{Size: i * 4096}.Append(batch, 100+i)
		batch = (&Call{Desc: descInt32(1, ""), Data: make([]byte, 4)}).Append(batch, 200+i)
	}
	c.send(batch, -1)
	seen := map[uint64]bool{}
	for range 12 {
		f := c.read()
		switch f.Type {
		case TypeAllocOK:
			m, err := DecodeAllocOK(f.Payload)
			if err != nil || f.FD < 0 {
				t.Fatalf("ALLOC_OK %v fd %d", err, f.FD)
			}
			var st unix.Stat_t
			if err := unix.Fstat(f.FD, &st); err != nil || uint64(st.Size) != m.Size || m.Size != (f.ID-100)*4096 {
				t.Errorf("ALLOC_OK id %d: size %d, its fd has %d bytes", f.ID, m.Size, st.Size)
			}
			unix.Close(f.FD)
		case TypeCallOK:
			if f.FD >= 0 {
				t.Errorf("CALL_OK with fd")
			}
		default:
			t.Fatalf("unexpected %s", f.Type)
		}
		seen[f.ID] = true
	}
	if len(seen) != 12 {
		t.Errorf("answers for %d distinct ids, want 12", len(seen))
	}
	c.c.Close()
	waitFds(t, base)
}
