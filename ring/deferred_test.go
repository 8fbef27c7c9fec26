package ring

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/collectived/collectived/collective"
)

// TestAbortAfterCompletedOp: a rank that has completed an op and then
// aborts (its owner found a mismatch in the next collective) must not make
// that op fail on ranks still finishing it: its data is all on the wire.
// Otherwise ranks disagree on which calls completed. Here the broadcast's
// root returns first and aborts at once; the others still get the whole
// broadcast, and only their next op fails, with the root's reason.
func TestAbortAfterCompletedOp(t *testing.T) {
	for _, pipe := range []bool{false, true} {
		t.Run(fmt.Sprintf("pipe=%v", pipe), func(t *testing.T) {
			rings, _ := faultWorldOver(t, 3, pipe, nil, nil)
			startAll(t, rings)
			const n = 8 << 20
			want := make([]byte, n)
			for i := range want {
				want[i] = byte(i * 7)
			}
			reason := errors.New("[mismatch] the next collective disagrees")
			d := collective.Desc{Op: collective.OpBroadcast, DType: collective.Bytes, Count: n}
			got := make([][]byte, len(rings))
			bcast := make([]error, len(rings))
			errs := opOnReal(t, rings, 30*time.Second, func(i int, r *Ring) error {
				buf := make([]byte, n)
				if i == 0 {
					copy(buf, want)
				} else {
					time.Sleep(time.Duration(i) * 30 * time.Millisecond) // late to receive
				}
				bcast[i] = r.Broadcast(d, buf)
				got[i] = buf
				if i == 0 && bcast[i] == nil {
					r.Abort(reason)
				}
				return r.Barrier(collective.Desc{Op: collective.OpBarrier})
			})
			for i := range rings {
				if bcast[i] != nil {
					t.Fatalf("rank %d: the broadcast before the abort failed: %v", i, bcast[i])
				}
				if !bytes.Equal(got[i], want) {
					t.Fatalf("rank %d: broadcast data differs", i)
				}
				if !errors.Is(errs[i], ErrAborted) && i != 0 || !strings.Contains(errs[i].Error(), reason.Error()) {
					t.Errorf("rank %d: next op gave %v, want the abort naming %q", i, errs[i], reason)
				}
			}
		})
	}
}

// InOp says whether a collective was under way where the failure began:
// here, at an abort's origin, or, for a call made on a ring that had
// already failed, in that earlier failure.
func TestErrorInOp(t *testing.T) {
	idle := &Error{Op: collective.OpInvalid, Err: ErrPeerClosed}
	for name, c := range map[string]struct {
		e    *Error
		want bool
	}{
		"idle here":                  {idle, false},
		"in an op here":              {&Error{Op: collective.OpAllReduce, Err: ErrPeerHung}, true},
		"abort from an origin in op": {&Error{Op: collective.OpInvalid, abortSet: true, abortOp: collective.OpBroadcast}, true},
		"abort from an idle origin":  {&Error{Op: collective.OpInvalid, abortSet: true, abortOp: collective.OpInvalid}, false},
		"call after an idle failure": {&Error{Op: collective.OpAllReduce, Err: idle}, false},
		"call after a failure in op": {&Error{Op: collective.OpBarrier, Err: &Error{Op: collective.OpAllReduce}}, true},
	} {
		if got := c.e.InOp(); got != c.want {
			t.Errorf("%s: InOp() = %v, want %v", name, got, c.want)
		}
	}
}
