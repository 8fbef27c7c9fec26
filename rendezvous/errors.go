package rendezvous

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Sentinel errors, for errors.Is. Every rejection wraps exactly one of the
// handshake sentinels together with both sides' values where they help.
var (
	ErrBadMagic         = errors.New("not a collectived rendezvous handshake (bad magic)")
	ErrMalformed        = errors.New("malformed handshake")
	ErrVersion          = errors.New("other protocol version")
	ErrByteOrder        = errors.New("other byte order")
	ErrJob              = errors.New("other job")
	ErrWorldSize        = errors.New("other world size")
	ErrDigest           = errors.New("other job shape digest")
	ErrStreams          = errors.New("other streams per link")
	ErrAuth             = errors.New("authentication failed")
	ErrUnexpectedRank   = errors.New("unexpected rank")
	ErrAddrNotInPeers   = errors.New("address not in peer list")
	ErrNotPrev          = errors.New("address of a peer that is not our prev")
	ErrReplay           = errors.New("replayed handshake")
	ErrHandshakeTimeout = errors.New("handshake timed out")
	ErrBusy             = errors.New("too many handshakes pending")
	ErrNotForming       = errors.New("not forming a ring now")
	ErrStale            = errors.New("stale formation attempt")

	ErrTimeout         = errors.New("ring formation timed out")
	ErrClosed          = errors.New("rendezvous listener closed")
	ErrFormInProgress  = errors.New("another Form is in progress on this listener")
	errSessionMismatch = errors.New("next node re-formed while we were connecting its streams")
)

// fatal reports whether err means the peer is configured differently or is
// not one of us: waiting out the formation deadline would only delay the
// same answer, so Form returns it at once.
func fatal(err error) bool {
	for _, s := range []error{ErrBadMagic, ErrMalformed, ErrVersion, ErrByteOrder, ErrJob,
		ErrWorldSize, ErrDigest, ErrStreams, ErrAuth, ErrUnexpectedRank, ErrAddrNotInPeers, ErrNotPrev} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// Reject codes carried in a status frame, so the dialing side learns the
// listener's reason as a sentinel. Values are wire codes: never renumber.
type rejectCode uint8

const (
	codeOK rejectCode = iota
	codeMalformed
	codeVersion
	codeByteOrder
	codeJob
	codeWorldSize
	codeDigest
	codeStreams
	codeAuth
	codeUnexpectedRank
	codeAddrNotInPeers
	codeReplay
	codeBusy
	codeNotForming
	codeStale
	codeNotPrev
)

var codeErrs = [...]error{
	codeMalformed:      ErrMalformed,
	codeVersion:        ErrVersion,
	codeByteOrder:      ErrByteOrder,
	codeJob:            ErrJob,
	codeWorldSize:      ErrWorldSize,
	codeDigest:         ErrDigest,
	codeStreams:        ErrStreams,
	codeAuth:           ErrAuth,
	codeUnexpectedRank: ErrUnexpectedRank,
	codeAddrNotInPeers: ErrAddrNotInPeers,
	codeReplay:         ErrReplay,
	codeBusy:           ErrBusy,
	codeNotForming:     ErrNotForming,
	codeStale:          ErrStale,
	codeNotPrev:        ErrNotPrev,
}

// handshakeSentinels are the reasons a listener refuses a connection, as
// its log and status count them (reasonOf).
var handshakeSentinels = []error{ErrBadMagic, ErrMalformed, ErrVersion, ErrByteOrder, ErrJob, ErrWorldSize,
	ErrDigest, ErrStreams, ErrAuth, ErrUnexpectedRank, ErrAddrNotInPeers, ErrNotPrev, ErrReplay,
	ErrHandshakeTimeout, ErrBusy, ErrNotForming, ErrStale}

// Reasons for refusals that wrap no sentinel: the connection ended or
// failed before the handshake did.
const (
	reasonClosed = "closed mid-handshake"
	reasonIO     = "connection error mid-handshake"
)

// reasonOf names err's sentinel, the kind of refusal that logs are
// rate-limited and status counts by.
func reasonOf(err error) string {
	for _, s := range handshakeSentinels {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return reasonClosed
	}
	return reasonIO
}

// codeOf maps an error to the code sent to the peer; 0 (OK) never results.
func codeOf(err error) rejectCode {
	for c := codeMalformed; int(c) < len(codeErrs); c++ {
		if errors.Is(err, codeErrs[c]) {
			return c
		}
	}
	return codeMalformed
}

func (c rejectCode) err() error {
	if c != codeOK && int(c) < len(codeErrs) {
		return codeErrs[c]
	}
	return fmt.Errorf("%w: unknown reject code %d", ErrMalformed, c)
}

// PeerError is a formation failure on one of the two links, in the manner
// of net.OpError: who we are, which neighbour, its address, and why.
type PeerError struct {
	Rank int    // our rank
	Link string // "next" or "prev"
	Peer int    // the neighbour's rank
	Addr string // the neighbour's address from the peer list
	Err  error
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("rendezvous rank %d: %s rank %d (%s) %v", e.Rank, e.Link, e.Peer, e.Addr, e.Err)
}

func (e *PeerError) Unwrap() error { return e.Err }

// timeoutError reads as the tail of a PeerError: "never answered within
// 2s: connection refused". It wraps ErrTimeout and the last cause seen.
type timeoutError struct {
	what  string // "never answered", "never connected"
	after time.Duration
	last  error // may be nil
}

func (e *timeoutError) Error() string {
	if e.last == nil {
		return fmt.Sprintf("%s within %v", e.what, e.after)
	}
	return fmt.Sprintf("%s within %v: %v", e.what, e.after, e.last)
}

func (e *timeoutError) Unwrap() []error {
	if e.last == nil {
		return []error{ErrTimeout}
	}
	return []error{ErrTimeout, e.last}
}

// rejectedError is the dialing side's view of a status frame refusing it.
type rejectedError struct {
	code   rejectCode
	reason string // the listener's own words, sanitized
}

func (e *rejectedError) Error() string {
	s := e.code.err()
	// The listener's reason usually repeats the sentinel's words first.
	reason := strings.TrimPrefix(e.reason, s.Error()+": ")
	if reason == "" {
		return fmt.Sprintf("refused us: %v", s)
	}
	return fmt.Sprintf("refused us: %v (its view: %s)", s, reason)
}

func (e *rejectedError) Unwrap() error { return e.code.err() }
