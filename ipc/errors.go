package ipc

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Code is the numeric error code of an ERROR frame (docs/PROTOCOL.md).
// A Code is itself an error, so that errors.Is(err, ipc.ErrMismatch) and
// errors.Is(err, ipc.CodeMismatch) both hold for any *Error of that code.
type Code uint16

const (
	CodeBadFrame    Code = 1
	CodeVersion     Code = 2
	CodeJob         Code = 3
	CodeRankTaken   Code = 4
	CodeRankRange   Code = 5
	CodeFull        Code = 6
	CodePermission  Code = 7
	CodeQuota       Code = 8
	CodeBadSegment  Code = 9
	CodeBusy        Code = 10
	CodeBadFD       Code = 11
	CodeBadRequest  Code = 12
	CodeTooLarge    Code = 13
	CodeTooMany     Code = 14
	CodeMismatch    Code = 15
	CodeTimeout     Code = 16
	CodePeerLost    Code = 17
	CodeTrainerLost Code = 18
	CodeAborted     Code = 19
	CodeShutdown    Code = 20
	CodeUnsupported Code = 21
	CodeInternal    Code = 22
	CodeCorrupt     Code = 23
)

var codeNames = [...]string{
	"", "BAD_FRAME", "VERSION", "JOB", "RANK_TAKEN", "RANK_RANGE", "FULL",
	"PERMISSION", "QUOTA", "BAD_SEGMENT", "BUSY", "BAD_FD", "BAD_REQUEST",
	"TOO_LARGE", "TOO_MANY", "MISMATCH", "TIMEOUT", "PEER_LOST",
	"TRAINER_LOST", "ABORTED", "SHUTDOWN", "UNSUPPORTED", "INTERNAL",
	"CORRUPT",
}

// String is the name the protocol document uses, e.g. "MISMATCH".
func (c Code) String() string {
	if c != 0 && int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("CODE(%d)", uint16(c))
}

// Known reports whether c is a code of the protocol (versions 1 to 4 have
// the same codes; CORRUPT was added to all of them).
func (c Code) Known() bool { return c != 0 && int(c) < len(codeNames) }

// Error makes a Code usable as a sentinel error. It is the code's name,
// like String (fmt prefers Error to String).
func (c Code) Error() string { return c.String() }

// Sentinels for errors.Is. Each is the Code itself, so any *Error with that
// code (which unwraps to its Code) matches.
var (
	ErrBadFrame    error = CodeBadFrame
	ErrVersion     error = CodeVersion
	ErrJob         error = CodeJob
	ErrRankTaken   error = CodeRankTaken
	ErrRankRange   error = CodeRankRange
	ErrFull        error = CodeFull
	ErrPermission  error = CodePermission
	ErrQuota       error = CodeQuota
	ErrBadSegment  error = CodeBadSegment
	ErrBusy        error = CodeBusy
	ErrBadFD       error = CodeBadFD
	ErrBadRequest  error = CodeBadRequest
	ErrTooLarge    error = CodeTooLarge
	ErrTooMany     error = CodeTooMany
	ErrMismatch    error = CodeMismatch
	ErrTimeout     error = CodeTimeout
	ErrPeerLost    error = CodePeerLost
	ErrTrainerLost error = CodeTrainerLost
	ErrAborted     error = CodeAborted
	ErrShutdown    error = CodeShutdown
	ErrUnsupported error = CodeUnsupported
	ErrInternal    error = CodeInternal
	ErrCorrupt     error = CodeCorrupt
)

// Error is the content of an ERROR frame: what went wrong (Code, for
// programs), why (Message, for people) and whether the daemon closes the
// connection after it (Fatal, the header's FATAL flag).
type Error struct {
	Code    Code
	Message string
	Fatal   bool
}

// Errorf builds a non-fatal *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Fatalf builds a fatal *Error.
func Fatalf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...), Fatal: true}
}

func (e *Error) Error() string {
	s := "collectived: " + e.Code.String()
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Fatal {
		s += " (connection closed)"
	}
	return s
}

// Unwrap returns the Code, which is what errors.Is compares with the
// sentinels.
func (e *Error) Unwrap() error { return e.Code }

// truncateMessage cuts s to at most MaxErrorMessage bytes without splitting
// a UTF-8 sequence, and replaces invalid UTF-8, so that any Go error text
// can travel in an ERROR frame.
func truncateMessage(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= MaxErrorMessage {
		return s
	}
	n := MaxErrorMessage
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// frameFault is a fatal *Error caused by one frame whose header was read
// and passed its checks: the ERROR frame carries that frame's id, so that
// a client knows which of its requests was at fault (docs/PROTOCOL.md,
// "ERROR"). Faults of no one frame (credentials, a malformed header, the
// hello timeout) stay on id 0.
type frameFault struct {
	id  uint64
	err *Error
}

func (f *frameFault) Error() string { return f.err.Error() }

// Unwrap gives the *Error, so errors.As and errors.Is see through it.
func (f *frameFault) Unwrap() error { return f.err }

// faultOf makes err, if it is an *Error, the fault of the frame with id;
// an error already tied to a frame keeps its frame.
func faultOf(id uint64, err error) error {
	var ff *frameFault
	if errors.As(err, &ff) {
		return err
	}
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	return &frameFault{id: id, err: e}
}

// faultID is the id an ERROR frame for err carries: the id of the frame
// that caused it, or 0.
func faultID(err error) uint64 {
	var ff *frameFault
	if errors.As(err, &ff) {
		return ff.id
	}
	return 0
}
