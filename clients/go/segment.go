package collectived

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/collectived/collectived/ipc"
	"golang.org/x/sys/unix"
)

// Segment is shared memory made by the daemon and mapped here. Calls on
// buffers inside it move no bytes through the socket.
type Segment struct {
	c    *Client
	id   uint32
	mem  []byte
	once sync.Once
}

// Alloc asks the daemon for a shared segment of at least n bytes.
func (c *Client) Alloc(n int) (*Segment, error) {
	if n <= 0 {
		return nil, fmt.Errorf("collectived: alloc %d bytes: size must be positive", n)
	}
	h, err := c.send(ipc.Alloc{Size: uint64(n)}.Append, nil)
	if err != nil {
		return nil, err
	}
	if err := h.Wait(); err != nil {
		return nil, fmt.Errorf("collectived: alloc %d bytes: %w", n, err)
	}
	if h.fd < 0 {
		return nil, fmt.Errorf("collectived: alloc %d bytes: ALLOC_OK came without an fd", n)
	}
	defer unix.Close(h.fd)
	mem, err := unix.Mmap(h.fd, 0, int(h.seg.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		c.freeID(h.seg.Segment)
		return nil, fmt.Errorf("collectived: mmap segment %d (%d bytes): %w", h.seg.Segment, h.seg.Size, err)
	}
	s := &Segment{c: c, id: h.seg.Segment, mem: mem}
	c.mu.Lock()
	c.segs = append(c.segs, s)
	c.mu.Unlock()
	return s, nil
}

// AllocSlice returns n elements of T in a new shared segment.
func AllocSlice[T Elem](c *Client, n int) ([]T, *Segment, error) {
	var z T
	s, err := c.Alloc(n * int(unsafe.Sizeof(z)))
	if err != nil {
		return nil, nil, err
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(s.mem))), n), s, nil
}

// Bytes is the segment's memory (its length is the page-rounded size).
func (s *Segment) Bytes() []byte { return s.mem }

// ID is the daemon's id of the segment.
func (s *Segment) ID() uint32 { return s.id }

// Free returns the segment to the daemon and unmaps it. The memory must not
// be used afterwards.
func (s *Segment) Free() error {
	var err error
	s.once.Do(func() {
		c := s.c
		c.mu.Lock()
		for i, x := range c.segs {
			if x == s {
				c.segs = append(c.segs[:i], c.segs[i+1:]...)
				break
			}
		}
		for i, x := range c.scratch {
			if x == s {
				c.scratch = append(c.scratch[:i], c.scratch[i+1:]...)
				break
			}
		}
		c.mu.Unlock()
		err = c.freeID(s.id)
		s.unmap()
	})
	return err
}

func (c *Client) freeID(id uint32) error {
	h, err := c.send(ipc.Free{Segment: id}.Append, nil)
	if err != nil {
		return err
	}
	if err := h.Wait(); err != nil {
		return fmt.Errorf("collectived: free segment %d: %w", id, err)
	}
	return nil
}

func (s *Segment) unmap() {
	if s.mem != nil {
		unix.Munmap(s.mem)
		s.mem = nil
	}
}

// locate finds the segment holding all of b, and b's offset in it.
func (c *Client) locate(b []byte) (*Segment, uint64, bool) {
	if len(b) == 0 {
		return nil, 0, false
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.segs {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(s.mem)))
		if p >= base && p+uintptr(len(b)) <= base+uintptr(len(s.mem)) {
			return s, uint64(p - base), true
		}
	}
	return nil, 0, false
}

// smallScratch is how many scratch segments a client makes for calls it
// could send inline (up to the daemon's InlineLimit): one for each of up
// to eight small calls in flight at once, as a trainer overlapping its
// gradient buckets makes them. Further ones go inline instead of each
// making a segment. With two, four 64 KiB calls in flight (bench
// --in-flight 4) took 440 µs, the last two inline on the socket both
// ways; with eight, 334 µs (paired 0.75, six runs; docs/TUNING.md,
// section 30). A segment is the daemon's inline limit, 64 KiB by default.
const smallScratch = 8

// takeScratch returns a free scratch segment of at least n bytes. For a
// call that could go inline it returns nil, nil when the client has made
// its smallScratch segments and none is free, or cannot make one (the
// daemon's shared-memory quota): such a call goes inline.
func (c *Client) takeScratch(n int) (*Segment, error) {
	c.mu.Lock()
	for i, s := range c.scratch {
		if len(s.mem) >= n {
			c.scratch = append(c.scratch[:i], c.scratch[i+1:]...)
			c.mu.Unlock()
			return s, nil
		}
	}
	small := n <= c.InlineLimit()
	if small && c.nscratch >= smallScratch {
		c.mu.Unlock()
		return nil, nil
	}
	if small {
		c.nscratch++
		// One size for all of them, so that any serves any small call.
		n = c.InlineLimit()
	}
	c.mu.Unlock()
	s, err := c.Alloc(n)
	if err != nil && small {
		c.mu.Lock()
		c.nscratch = smallScratch // do not ask again on every call
		c.mu.Unlock()
		return nil, nil
	}
	return s, err
}

func (c *Client) putScratch(s *Segment) {
	c.mu.Lock()
	c.scratch = append(c.scratch, s)
	c.mu.Unlock()
}
