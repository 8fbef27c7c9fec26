package collectived

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/collectived/collectived/collective"
	"github.com/collectived/collectived/ipc"
)

func dialInternal(t *testing.T, inlineMax int) *Client {
	t.Helper()
	c, err := Dial(Options{LocalRank: -1, InlineMax: inlineMax})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// pattern is n bytes of float32s that differ from the junk a test writes
// over a buffer in flight.
func pattern(n int, seed float32) []byte {
	b := make([]byte, n)
	for i := 0; i+4 <= n; i += 4 {
		binary.LittleEndian.PutUint32(b[i:], uint32(int32(seed)+int32(i)))
	}
	return b
}

func sumDesc(n int) collective.Desc {
	return collective.Desc{Op: collective.OpAllReduce, DType: collective.Int32, Reduce: collective.Sum, Count: uint64(n / 4)}
}

// startScribbled starts an allreduce on a copy of want and overwrites the
// buffer while the call is in flight: in a world of one the result is the
// input, so only a result copied back into the buffer restores it.
func startScribbled(t *testing.T, c *Client, want []byte) (*Handle, []byte) {
	t.Helper()
	buf := bytes.Clone(want)
	h, err := c.Start(sumDesc(len(buf)), buf)
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		buf[i] = 0xEE
	}
	return h, buf
}

// A call on plain memory goes inline up to InlineMax (capped by the
// daemon's limit) and through a scratch segment above it; either way the
// result lands in the caller's buffer.
func TestPlainMemoryPath(t *testing.T) {
	const limit = 64 << 10 // the test daemon's inline limit (the default)
	cases := []struct {
		opt, max, n int
		copied      bool
	}{
		{0, DefaultInlineMax, DefaultInlineMax, false},
		{0, DefaultInlineMax, DefaultInlineMax + 4, true},
		{0, DefaultInlineMax, limit, true},
		{100, 100, 100, false},
		{100, 100, 104, true},
		{1 << 30, limit, limit, false},
		{-1, -1, 4, true},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("InlineMax=%d/%dB", tc.opt, tc.n), func(t *testing.T) {
			c := dialInternal(t, tc.opt)
			if c.InlineLimit() != limit {
				t.Fatalf("daemon's inline limit %d, this test assumes %d", c.InlineLimit(), limit)
			}
			if got := c.InlineMax(); got != tc.max {
				t.Fatalf("InlineMax() = %d, want %d", got, tc.max)
			}
			want := pattern(tc.n, 7)
			for k := 0; k < 3; k++ {
				h, buf := startScribbled(t, c, want)
				if copied := h.scratch != nil; copied != tc.copied {
					t.Fatalf("call %d: through a scratch segment: %v, want %v", k, copied, tc.copied)
				}
				if err := h.Wait(); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf, want) {
					t.Fatalf("call %d: the result did not land in the buffer", k)
				}
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			wantSegs := 0
			if tc.copied {
				wantSegs = 1 // made once, reused by the next calls
			}
			if c.nscratch != wantSegs || len(c.scratch) != wantSegs {
				t.Fatalf("scratch segments made %d, free %d; want %d", c.nscratch, len(c.scratch), wantSegs)
			}
		})
	}
}

// Small calls in flight at once share smallScratch segments; the ones
// beyond go inline instead of each making a segment.
func TestSmallCallsBeyondScratchGoInline(t *testing.T) {
	c := dialInternal(t, 0)
	n := 4 * DefaultInlineMax
	var hs []*Handle
	var bufs, wants [][]byte
	for k := 0; k < smallScratch+2; k++ {
		want := pattern(n, float32(k))
		h, buf := startScribbled(t, c, want)
		if copied, wantCopied := h.scratch != nil, k < smallScratch; copied != wantCopied {
			t.Fatalf("call %d of %d in flight: through a scratch segment: %v, want %v", k, smallScratch+2, copied, wantCopied)
		}
		hs, bufs, wants = append(hs, h), append(bufs, buf), append(wants, want)
	}
	for k, h := range hs {
		if err := h.Wait(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bufs[k], wants[k]) {
			t.Fatalf("call %d: the result did not land in the buffer", k)
		}
	}
	if c.nscratch != smallScratch || len(c.scratch) != smallScratch {
		t.Fatalf("scratch segments made %d, free %d; want %d", c.nscratch, len(c.scratch), smallScratch)
	}
}

// A copied call that got no answer leaves its scratch segment out of use,
// since the daemon may still write into it; one the daemon answered, even
// with an error, gives it back, and only a success copies the result.
func TestScratchAfterFailedCall(t *testing.T) {
	c := dialInternal(t, 0)
	cases := []struct {
		name     string
		err      error
		reused   bool
		copiedIn bool
	}{
		{"success", nil, true, true},
		{"daemon error", &ipc.Error{Code: ipc.CodeMismatch, Message: "mismatch"}, true, false},
		{"fatal daemon error", &ipc.Error{Code: ipc.CodeBadFrame, Message: "bad", Fatal: true}, false, false},
		{"no answer", fmt.Errorf("no reply: %w", ipc.ErrTimeout), false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := c.takeScratch(4096)
			if err != nil || s == nil {
				t.Fatalf("takeScratch: %v, %v", s, err)
			}
			copy(s.mem, pattern(4096, 3))
			buf := make([]byte, 4096)
			h := &Handle{c: c, scratch: s, copyBack: buf}
			if got := h.complete(tc.err); got != tc.err {
				t.Fatalf("complete returned %v, want %v", got, tc.err)
			}
			if copiedIn := bytes.Equal(buf, pattern(4096, 3)); copiedIn != tc.copiedIn {
				t.Fatalf("result copied to the buffer: %v, want %v", copiedIn, tc.copiedIn)
			}
			c.mu.Lock()
			reused := false
			for _, x := range c.scratch {
				reused = reused || x == s
			}
			c.mu.Unlock()
			if reused != tc.reused {
				t.Fatalf("scratch segment back in use: %v, want %v", reused, tc.reused)
			}
		})
	}
}
