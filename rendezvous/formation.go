package rendezvous

import (
	"fmt"
	"net"
)

// formation is the prev side of one Form call: the streams accepted so far.
// All fields are guarded by Listener.mu.
type formation struct {
	gen      uint32
	session  session // ours, sent in our hellos
	dSess    session // the prev peer's attempt whose streams we hold
	hasSess  bool
	conns    []net.Conn // committed streams by index
	gens     []uint32   // their generation proposals
	reserved []net.Conn // confirmed to the peer, not yet committed
	n        int
	complete chan struct{} // closed when n == len(conns)
	done     bool          // Form has returned; nothing more is taken
}

func newFormation(gen uint32, s session, streams int) *formation {
	return &formation{
		gen:      gen,
		session:  s,
		conns:    make([]net.Conn, streams),
		gens:     make([]uint32, streams),
		reserved: make([]net.Conn, streams),
		complete: make(chan struct{}),
	}
}

// reserve claims stream h.Stream for c. cur is the listener's formation now:
// a stream greeted under an earlier Form is stale.
func (f *formation) reserve(cur *formation, c net.Conn, h *hello) error {
	i := int(h.Stream)
	switch {
	case cur != f || f.done:
		return fmt.Errorf("%w: stream %d was greeted by an earlier Form (generation %d)", ErrStale, i, f.gen)
	case f.n == len(f.conns):
		return fmt.Errorf("%w: all %d streams of this formation are already connected", ErrNotForming, len(f.conns))
	case f.hasSess && h.Session.less(f.dSess):
		return fmt.Errorf("%w: attempt %d.%d of rank %d superseded by attempt %d.%d",
			ErrStale, h.Session.Epoch, h.Session.Seq, h.Rank, f.dSess.Epoch, f.dSess.Seq)
	case !f.hasSess || f.dSess.less(h.Session):
		f.restart(h.Session)
	}
	if f.conns[i] != nil || f.reserved[i] != nil {
		return fmt.Errorf("%w: duplicate stream %d from rank %d in attempt %d.%d",
			ErrUnexpectedRank, i, h.Rank, h.Session.Epoch, h.Session.Seq)
	}
	f.reserved[i] = c
	return nil
}

// restart drops the streams of an older attempt of the prev peer: it began
// again, so those are dead or about to be.
func (f *formation) restart(s session) {
	for i, c := range f.conns {
		if c != nil {
			c.Close()
			f.conns[i] = nil
		}
		f.reserved[i] = nil
	}
	f.n = 0
	f.dSess, f.hasSess = s, true
}

// commit moves a confirmed stream into place, unless the formation ended or
// a newer attempt took its slot meanwhile.
func (f *formation) commit(c net.Conn, h *hello) error {
	i := int(h.Stream)
	if f.done || f.reserved[i] != c {
		c.Close()
		return fmt.Errorf("%w: stream %d confirmed, but the formation ended or restarted before it was taken", ErrStale, i)
	}
	f.reserved[i] = nil
	f.conns[i] = c
	f.gens[i] = h.Generation
	f.n++
	if f.n == len(f.conns) {
		close(f.complete)
	}
	return nil
}

// finish ends the formation and returns the committed streams.
func (f *formation) finish() []net.Conn {
	f.done = true
	return f.conns
}
