package shm

import (
	"errors"
	"fmt"
	"sync"
)

// Sentinel errors of Table.
var (
	ErrQuota      = errors.New("shared-memory quota exceeded")
	ErrBadSegment = errors.New("unknown segment")
	ErrRange      = errors.New("range outside segment")
	ErrBusy       = errors.New("segment in use")
	ErrClosed     = errors.New("segment table closed")
)

// Table holds one client's segments under a quota. Calls in flight hold
// references (Acquire); a referenced segment cannot be freed, and one left
// when the table closes is unmapped when its last reference goes.
type Table struct {
	mu      sync.Mutex
	quota   int64
	maxSegs int
	held    int64
	next    uint32
	segs    map[uint32]*entry
	closed  bool
}

type entry struct {
	t       *Table
	id      uint32
	seg     *Segment
	refs    int
	dropped bool   // removed from the table; unmap at the last release
	release func() // e.releaseRef, bound once so Acquire does not allocate
}

// NewTable returns an empty table that holds at most quota bytes in at
// most maxSegs segments. The count matters as much as the bytes: each
// segment holds an fd and a mapping in the daemon, so a client making
// many small ones would otherwise run the daemon (and every other client)
// out of fds long before its quota of bytes.
func NewTable(quota int64, maxSegs int) *Table {
	return &Table{quota: quota, maxSegs: maxSegs, segs: make(map[uint32]*entry)}
}

// Reserve reports whether n more bytes would fit the quota now, so that a
// caller can refuse before creating or importing a segment. Add checks
// again.
func (t *Table) Reserve(n int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.fitLocked(n)
}

func (t *Table) fitLocked(n int64) error {
	if t.closed {
		return ErrClosed
	}
	if n < 0 || n > t.quota-t.held {
		return fmt.Errorf("%w: request of %d bytes, %d held, quota %d", ErrQuota, n, t.held, t.quota)
	}
	if len(t.segs) >= t.maxSegs {
		return fmt.Errorf("%w: %d segments held, the most one client may hold (the daemon's limits.max_segments); free one first", ErrQuota, len(t.segs))
	}
	return nil
}

// Add takes ownership of s and returns its id (never 0). On error s is
// left to the caller.
func (t *Table) Add(s *Segment) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.fitLocked(s.Size()); err != nil {
		return 0, err
	}
	id := t.next + 1
	for id == 0 || t.segs[id] != nil {
		id++
	}
	t.next = id
	e := &entry{t: t, id: id, seg: s}
	e.release = e.releaseRef
	t.segs[id] = e
	t.held += s.Size()
	return id, nil
}

// Acquire returns n bytes at off in segment id and a function that releases
// the reference; until it is called the segment cannot be freed or
// unmapped. The release function must be called exactly once.
func (t *Table) Acquire(id uint32, off, n uint64) ([]byte, func(), error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.segs[id]
	if e == nil || t.closed {
		return nil, nil, fmt.Errorf("%w: segment %d", ErrBadSegment, id)
	}
	size := uint64(e.seg.Size())
	if off > size || n > size-off {
		return nil, nil, fmt.Errorf("%w: %d bytes at offset %d, segment %d has %d bytes", ErrRange, n, off, id, size)
	}
	e.refs++
	return e.seg.Bytes()[off : off+n : off+n], e.release, nil
}

func (e *entry) releaseRef() {
	t := e.t
	t.mu.Lock()
	e.refs--
	if e.refs < 0 {
		t.mu.Unlock()
		panic(fmt.Sprintf("shm: segment %d released more often than acquired", e.id))
	}
	unmap := e.refs == 0 && e.dropped
	t.mu.Unlock()
	if unmap {
		e.seg.Close()
	}
}

// Free unmaps and drops segment id.
func (t *Table) Free(id uint32) error {
	t.mu.Lock()
	e := t.segs[id]
	if e == nil {
		t.mu.Unlock()
		return fmt.Errorf("%w: segment %d", ErrBadSegment, id)
	}
	if refs := e.refs; refs > 0 {
		t.mu.Unlock()
		return fmt.Errorf("%w: segment %d is used by %d call(s) in flight", ErrBusy, id, refs)
	}
	delete(t.segs, id)
	t.held -= e.seg.Size()
	t.mu.Unlock()
	return e.seg.Close()
}

// Close drops every segment: unreferenced ones are unmapped now, the others
// when their last reference is released. Later Adds fail. Idempotent.
func (t *Table) Close() {
	t.mu.Lock()
	t.closed = true
	var now []*Segment
	for id, e := range t.segs {
		delete(t.segs, id)
		t.held -= e.seg.Size()
		if e.refs == 0 {
			now = append(now, e.seg)
		} else {
			e.dropped = true
		}
	}
	t.mu.Unlock()
	for _, s := range now {
		s.Close()
	}
}

// Held is the number of bytes of segments in the table.
func (t *Table) Held() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.held
}

// Len is the number of segments in the table.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.segs)
}
