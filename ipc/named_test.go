package ipc

import (
	"errors"
	"strings"
	"testing"

	"github.com/collectived/collectived/collective"
)

// The NAMED flag (version 4): round trip, refused on older connections
// as an undefined flag before the payload is parsed, and a name needed.
func TestCallNamedFlag(t *testing.T) {
	c := Call{Desc: collective.Desc{Op: collective.OpAllReduce, DType: collective.Float32, Reduce: collective.Sum,
		Count: 1, Name: "layer1.grad", Named: true}, Data: make([]byte, 4)}
	frame := c.Encode(7)
	p := frame[HeaderSize:]
	if p[3] != CallFlagNamed {
		t.Fatalf("flags 0x%02x, want NAMED 0x%02x", p[3], CallFlagNamed)
	}
	var got Call
	if err := DecodeCall(p, &got, nil); err != nil || !got.Desc.Named || got.Desc.Name != "layer1.grad" {
		t.Fatalf("decoded %+v, %v", got.Desc, err)
	}
	if got.Desc.Since() != 4 {
		t.Errorf("a named call needs version %d, want 4", got.Desc.Since())
	}
	for v := 1; v <= 3; v++ {
		err := CheckExtFlag(p, v)
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeBadFrame || !e.Fatal || !strings.Contains(e.Message, "NAMED needs 4") {
			t.Errorf("version %d: %v, want fatal BAD_FRAME naming NAMED", v, err)
		}
	}
	if err := CheckExtFlag(p, 4); err != nil {
		t.Errorf("version 4: %v", err)
	}
	c.Desc.Name = ""
	if _, err := CheckCall(&c, CallLimits{Version: 4, WorldSize: 2, InlineLimit: 1 << 16}); err == nil ||
		!strings.Contains(err.Error(), "a named call needs a name") {
		t.Errorf("a named call without a name: %v", err)
	}
	plain := c.Desc
	plain.Name, plain.Named = "layer1.grad", false
	if named := (collective.Desc{Op: plain.Op, DType: plain.DType, Reduce: plain.Reduce, Count: 1, Name: "layer1.grad", Named: true}); plain.Equal(named) || plain.Fingerprint() == named.Fingerprint() {
		t.Error("a named call and an ordered one of the same name compare equal")
	}
}
