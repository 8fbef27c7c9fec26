package daemon

import (
	"errors"
	"fmt"
)

// kindError is a failure the core found itself. It unwraps to the ring's
// sentinel for its kind (ring.ErrMismatch, ErrTimeout, ErrCallerLost,
// ErrShutdown; errInternal), which abort frames carry to the other nodes
// as a code, so that every node chooses the trainers' error code with
// errors.Is; its text is the message alone, without the sentinel's.
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// failure returns a core failure of the given kind.
func failKind(kind error, format string, args ...any) error {
	return &kindError{msg: fmt.Sprintf(format, args...), kind: kind}
}

// errInternal marks a failure that is the daemon's own bug.
var errInternal = errors.New("internal error")
