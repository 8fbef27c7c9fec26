package ring

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/collectived/collectived/collective"
)

// Sentinels for errors.Is. A ring error wraps exactly one of them as its
// cause, except that an error learned from an abort frame wraps both
// ErrAborted and the sentinel of the original failure.
var (
	ErrClosed     = errors.New("ring closed")
	ErrAborted    = errors.New("aborted")
	ErrPeerClosed = errors.New("peer closed the connection")
	ErrTimeout    = errors.New("no progress")
	ErrPeerHung   = errors.New("peer hung: no frame within heartbeat timeout")
	ErrMismatch   = errors.New("collective mismatch")
	ErrBadFrame   = errors.New("bad frame")
	ErrGeneration = errors.New("generation mismatch")
	// ErrCorrupt: a frame's checksum did not match (frame.go): its bytes
	// changed between the peer's encoding and this rank's reading, on the
	// link or in a man in the middle. The error names the link.
	ErrCorrupt = errors.New("frame corrupted in transit")
	// ErrBusy is returned (without failing the ring) when an op is called
	// while another is in progress: ops are called by one goroutine at a time.
	ErrBusy = errors.New("another op is in progress on this ring")
	// ErrNotStarted is returned by an op called before Start succeeded.
	ErrNotStarted = errors.New("ring not started")

	// Causes the ring's owner gives Abort, carried by abort frames as
	// codes of their own, so that every rank tells them apart with
	// errors.Is rather than by reading the reason text. An owner's
	// mismatch or timeout wraps ErrMismatch or ErrTimeout.
	ErrCallerLost = errors.New("a caller left mid-collective")
	ErrShutdown   = errors.New("shutting down")
)

// Error is the failure of a ring, as seen by one rank, in the manner of
// net.OpError: what was under way, which peer, where it began, and why.
type Error struct {
	Rank       int           // the reporting rank
	Op         collective.Op // OpInvalid when no op was under way
	Seq        uint64
	Step       int // -1 when not within a step
	Generation uint32
	PeerRank   int // -1 when no peer is involved
	PeerAddr   string
	Origin     int // the rank where the failure began
	// Culprit is the rank the origin found at fault: the neighbour whose
	// connection closed, that stopped answering, or that sent a bad frame,
	// another generation or a frame that arrived corrupted (ErrCorrupt:
	// the link from it to the origin, or the sender, changed the bytes).
	// -1 when no one rank is: a mismatch (two calls disagree), a timeout
	// (the silent rank may be further away), an abort by the ring's owner
	// (a trainer lost, a shutdown).
	Culprit int
	Err     error

	phase string // shown instead of Op when Op is OpInvalid ("start", "idle")

	// abortSeq and abortOp, when abortSet, are the origin's op as an abort
	// frame named it; frames forwarding the abort keep them, so that every
	// rank judges the abort by where the origin was, not by the forwarder.
	abortSet bool
	abortSeq uint64
	abortOp  collective.Op
}

func (e *Error) Unwrap() error { return e.Err }

// InOp reports whether the failure came while a rank was inside an op:
// this rank, or, for an abort received, its origin (as the abort frame
// said). A failure while the ranks concerned were idle (a neighbour dying
// between ops) interrupted no collective. For a call refused because the
// ring had already failed, it is the earlier failure that counts.
func (e *Error) InOp() bool {
	if inner, ok := e.Err.(*Error); ok {
		return inner.InOp()
	}
	return e.Op != collective.OpInvalid || (e.abortSet && e.abortOp != collective.OpInvalid)
}

func (e *Error) Error() string {
	return "ring rank " + strconv.Itoa(e.Rank) + ": " + e.detail()
}

// detail is the message without the reporting rank, which is also the
// reason text carried by abort frames.
func (e *Error) detail() string { return e.render(true) }

// reason is the text an abort frame carries: the detail without the
// origin, which travels in the frame header.
func (e *Error) reason() string { return e.render(false) }

func (e *Error) render(withOrigin bool) string {
	s := e.where()
	if inner, ok := e.Err.(*Error); ok {
		return s + "failed earlier: " + inner.render(withOrigin)
	}
	if e.PeerRank >= 0 {
		s += "from rank " + strconv.Itoa(e.PeerRank)
		if e.PeerAddr != "" {
			s += " (" + e.PeerAddr + ")"
		}
		s += ": "
	}
	if withOrigin {
		s += "origin rank " + strconv.Itoa(e.Origin) + ": "
	}
	if e.Err != nil {
		s += e.Err.Error()
	}
	return s
}

func (e *Error) where() string {
	var s string
	if e.Op != collective.OpInvalid {
		s = e.Op.String() + " seq " + strconv.FormatUint(e.Seq, 10)
		if e.Step >= 0 {
			s += " step " + strconv.Itoa(e.Step)
		}
	} else if e.phase != "" {
		s = e.phase
	} else {
		s = "idle"
	}
	return s + ": "
}

// abortCode names the sentinel of the original failure inside an abort
// frame, so a rank far from the origin can still match it with errors.Is.
type abortCode uint8

const (
	codeExternal abortCode = iota // Abort called by the ring's owner
	codePeerClosed
	codeTimeout
	codePeerHung
	codeMismatch
	codeBadFrame
	codeGeneration
	codeOther
	codeCallerLost
	codeShutdown
	codeCorrupt
)

var codeSentinels = [...]error{
	codeExternal:   nil,
	codePeerClosed: ErrPeerClosed,
	codeTimeout:    ErrTimeout,
	codePeerHung:   ErrPeerHung,
	codeMismatch:   ErrMismatch,
	codeBadFrame:   ErrBadFrame,
	codeGeneration: ErrGeneration,
	codeOther:      nil,
	codeCallerLost: ErrCallerLost,
	codeShutdown:   ErrShutdown,
	codeCorrupt:    ErrCorrupt,
}

func codeOf(err error) abortCode {
	var ae *abortError
	if errors.As(err, &ae) {
		return ae.code
	}
	switch {
	case errors.Is(err, ErrClosed): // our owner closed us: a peer closed, to them
		return codePeerClosed
	case errors.Is(err, ErrPeerClosed):
		return codePeerClosed
	case errors.Is(err, ErrTimeout):
		return codeTimeout
	case errors.Is(err, ErrPeerHung):
		return codePeerHung
	case errors.Is(err, ErrMismatch):
		return codeMismatch
	case errors.Is(err, ErrBadFrame):
		return codeBadFrame
	case errors.Is(err, ErrGeneration):
		return codeGeneration
	case errors.Is(err, ErrCorrupt):
		return codeCorrupt
	case errors.Is(err, ErrCallerLost):
		return codeCallerLost
	case errors.Is(err, ErrShutdown):
		return codeShutdown
	case errors.Is(err, ErrAborted):
		return codeExternal
	}
	return codeOther
}

// abortError is the cause carried by an abort frame: the original reason
// text and the sentinel of the original failure.
type abortError struct {
	code   abortCode
	reason string
	cause  error // local cause when Abort was called here; nil when received
}

func (e *abortError) Error() string { return "aborted: " + e.reason }

func (e *abortError) Unwrap() []error {
	errs := []error{ErrAborted}
	if int(e.code) < len(codeSentinels) && codeSentinels[e.code] != nil {
		errs = append(errs, codeSentinels[e.code])
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// mismatchError shows both descriptions of a diverged collective, each
// with the rank that made it: the text travels in abort frames to ranks
// for which "local" would mean another rank.
type mismatchError struct {
	local, remote string
	rank, peer    int
	how           string
}

func (e *mismatchError) Error() string {
	return fmt.Sprintf("%v: rank %d called %s, rank %d sent %s%s", ErrMismatch, e.rank, e.local, e.peer, e.remote, e.how)
}

func (e *mismatchError) Unwrap() error { return ErrMismatch }
