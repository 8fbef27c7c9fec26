package ipc

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// The shared vectors (clients/testdata) are an independent reading of
// docs/PROTOCOL.md; every codec must agree with them byte for byte.
type vector struct {
	Name      string                     `json:"name"`
	Direction string                     `json:"direction"`
	Hex       string                     `json:"hex"`
	Decoded   map[string]json.RawMessage `json:"decoded"`
	FD        bool                       `json:"fd"`
	Error     string                     `json:"error"`
	Valid     *bool                      `json:"valid"`
	// Context is the connection a vector is read on (the newest version,
	// world unstated, when absent); Refused names the code the daemon answers a
	// well-formed CALL with in that context.
	Context struct {
		WorldSize         int `json:"world_size"`
		WorldRank         int `json:"world_rank"`
		ConnectionVersion int `json:"connection_version"`
	} `json:"context"`
	Refused string `json:"refused"`
	Rule    string `json:"rule"`
}

// vectorChecks maps a vector's check name to words our messages use for it.
var vectorChecks = map[string][]string{
	"frame_too_long":     {"exceeds the limit"},
	"unknown_type":       {"unknown frame type"},
	"reserved_nonzero":   {"reserved"},
	"bad_flags":          {"flags"},
	"bad_magic":          {"magic"},
	"payload_length":     {"payload is", "runs past", "after the"},
	"inline_data_length": {"inline data is"},
	"bad_version":        {"protocol version"},
	"bad_ndim":           {"dimensions"},
}

// decodeAny decodes a whole frame with the pre-HELLO bound and re-encodes
// it with our encoder; it returns the re-encoded frame and the fields.
func decodeAny(b []byte) (Header, map[string]any, []byte, error) {
	h, _, f, out, err := decodeCallable(b, Version)
	return h, f, out, err
}

// decodeCallable is decodeAny on a connection of the given version; it
// also returns a decoded CALL for the daemon's further checks.
func decodeCallable(b []byte, version int) (Header, *Call, map[string]any, []byte, error) {
	var call *Call
	h, f, out, err := decodeFrame(b, version, &call)
	return h, call, f, out, err
}

func decodeFrame(b []byte, version int, callOut **Call) (Header, map[string]any, []byte, error) {
	h, err := DecodeHeader(b, MaxHelloFrame)
	if err != nil {
		return h, nil, nil, err
	}
	p := b[HeaderSize:]
	if int(h.Length) != len(p) {
		return h, nil, nil, errors.New("length field does not match the vector's payload")
	}
	f := map[string]any{}
	var out []byte
	switch h.Type {
	case TypeHello:
		m, err := DecodeHello(p)
		if err != nil {
			return h, nil, nil, err
		}
		flags := 0
		if m.Observer {
			flags = 1
		}
		f = map[string]any{"magic": Magic, "version": uint64(m.Version), "flags": uint64(flags), "local_rank": int64(m.LocalRank),
			"pid": uint64(m.PID), "job": m.Job, "label": m.Label}
		out = m.Encode(h.ID)
	case TypeHelloOK:
		m, err := DecodeHelloOK(p)
		if err != nil {
			return h, nil, nil, err
		}
		f = map[string]any{"version": uint64(m.Version), "world_rank": uint64(m.WorldRank), "world_size": uint64(m.WorldSize),
			"node_rank": uint64(m.NodeRank), "node_count": uint64(m.NodeCount), "local_rank": uint64(m.LocalRank),
			"local_size": uint64(m.LocalSize), "inline_limit": uint64(m.InlineLimit), "max_frame": uint64(m.MaxFrame),
			"max_in_flight": uint64(m.MaxInFlight), "generation": uint64(m.Generation), "shm_quota": m.ShmQuota, "timeout_ms": m.TimeoutMS}
		if m.Version >= 3 {
			f["first_call_timeout_ms"] = m.FirstCallTimeoutMS
		}
		out = m.Encode(h.ID)
	case TypeAlloc:
		m, err := DecodeAlloc(p)
		if err != nil {
			return h, nil, nil, err
		}
		f["size"] = m.Size
		out = m.Encode(h.ID)
	case TypeAllocOK:
		m, err := DecodeAllocOK(p)
		if err != nil {
			return h, nil, nil, err
		}
		f["segment"], f["size"] = uint64(m.Segment), m.Size
		out = m.Encode(h.ID)
	case TypeRegister:
		m, err := DecodeRegister(p)
		if err != nil {
			return h, nil, nil, err
		}
		f["size"] = m.Size
		out = m.Encode(h.ID)
	case TypeRegisterOK:
		m, err := DecodeRegisterOK(p)
		if err != nil {
			return h, nil, nil, err
		}
		f["segment"], f["size"] = uint64(m.Segment), m.Size
		out = m.Encode(h.ID)
	case TypeFree:
		m, err := DecodeFree(p)
		if err != nil {
			return h, nil, nil, err
		}
		f["segment"] = uint64(m.Segment)
		out = m.Encode(h.ID)
	case TypeFreeOK, TypeStatus, TypeLane, TypeWake, TypeWakeClient:
		if err := DecodeEmpty(h.Type, p); err != nil {
			return h, nil, nil, err
		}
		out = AppendEmpty(nil, h.Type, h.ID)
	case TypeLaneOK:
		m, err := DecodeLaneOK(p)
		if err != nil {
			return h, nil, nil, err
		}
		f["size"] = m.Size
		out = m.Append(nil, h.ID)
	case TypeStatusOK:
		m, err := DecodeStatusOK(p)
		if err != nil {
			return h, nil, nil, err
		}
		f["json"] = string(m.JSON)
		out = m.Encode(h.ID)
	case TypeCall:
		if err := CheckExtFlag(p, version); err != nil {
			return h, nil, nil, err
		}
		m := new(Call)
		if err := DecodeCall(p, m, nil); err != nil {
			return h, nil, nil, err
		}
		*callOut = m
		// The EXT bit is the sender's choice when the extension is empty;
		// NAMED is Desc.Named, which Append sets again.
		flags := uint64(p[3])
		f = map[string]any{"op": uint64(m.Desc.Op), "dtype": uint64(m.Desc.DType), "reduce": uint64(m.Desc.Reduce),
			"flags": flags, "root": uint64(m.Desc.Root), "count": m.Desc.Count, "name": m.Desc.Name}
		if m.SHM {
			f["segment"], f["offset"] = uint64(m.Segment), m.Offset
			if m.Out {
				f["out_segment"], f["out_offset"] = uint64(m.OutSegment), m.OutOffset
			}
		} else {
			f["data"] = hex.EncodeToString(m.Data)
		}
		if p[3]&CallFlagExt != 0 {
			var xf uint64
			if m.Desc.Counts != nil {
				xf |= uint64(extCounts)
				f["counts"] = m.Desc.Counts
			}
			if m.Desc.Scaled() {
				xf |= uint64(extScale)
				f["prescale"], f["postscale"] = orOne(m.Desc.PreScale), orOne(m.Desc.PostScale)
			}
			if m.Out {
				xf |= uint64(extOut)
			}
			f["xflags"] = xf
			f["dims"] = append([]uint64{}, m.Desc.Shape.Slice()...)
		}
		out = m.Encode(h.ID)
	case TypeCallOK:
		var m CallOK
		if err := DecodeCallOK(p, &m); err != nil {
			return h, nil, nil, err
		}
		f = map[string]any{"generation": uint64(m.Generation), "seq": m.Seq, "result": hex.EncodeToString(m.Result)}
		out = m.Encode(h.ID)
	case TypeError:
		m, err := DecodeError(h.Flags, p)
		if err != nil {
			return h, nil, nil, err
		}
		f["code"], f["message"] = uint64(m.Code), m.Message
		out = m.Encode(h.ID)
	}
	f["type"], f["id"], f["frame_flags"] = h.Type.String(), h.ID, uint64(h.Flags)
	return h, f, out, nil
}

func TestSharedVectors(t *testing.T) {
	raw, err := os.ReadFile("../clients/testdata/vectors.json")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("clients/testdata/vectors.json not present")
	}
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range vs {
		b, err := hex.DecodeString(v.Hex)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		version := Version
		if v.Context.ConnectionVersion != 0 {
			version = v.Context.ConnectionVersion
		}
		h, call, fields, out, err := decodeCallable(b, version)
		if v.Refused != "" {
			checkRefused(t, v, call, err)
			continue
		}
		if v.Valid != nil && !*v.Valid {
			words := vectorChecks[v.Error]
			if words == nil {
				t.Errorf("%s: unknown check %q", v.Name, v.Error)
				continue
			}
			if err == nil {
				t.Errorf("%s: decoded, want failure %s", v.Name, v.Error)
				continue
			}
			// A version that cannot be read is the protocol's VERSION
			// error; every other broken frame is BAD_FRAME.
			code := CodeBadFrame
			if v.Error == "bad_version" {
				code = CodeVersion
			}
			var e *Error
			if !errors.As(err, &e) || e.Code != code || !e.Fatal {
				t.Errorf("%s: error %v, want fatal %s", v.Name, err, code)
			}
			named := false
			for _, w := range words {
				named = named || strings.Contains(err.Error(), w)
			}
			if !named {
				t.Errorf("%s: error %q does not name %s", v.Name, err, v.Error)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", v.Name, err)
			continue
		}
		if !bytes.Equal(out, b) {
			t.Errorf("%s: re-encoded\n %x\nwant\n %x", v.Name, out, b)
		}
		if h.Type.CarriesFD() != v.FD {
			t.Errorf("%s: CarriesFD %v, vector says %v", v.Name, h.Type.CarriesFD(), v.FD)
		}
		if (v.Direction == "c2d") != h.Type.IsRequest() {
			t.Errorf("%s: direction %s but IsRequest %v", v.Name, v.Direction, h.Type.IsRequest())
		}
		for k, rawv := range v.Decoded {
			got, ok := fields[k]
			if !ok {
				t.Errorf("%s: field %s not decoded", v.Name, k)
				continue
			}
			var same bool
			switch g := got.(type) {
			case []uint64:
				var w []uint64
				same = json.Unmarshal(rawv, &w) == nil && len(w) == len(g)
				for i := 0; same && i < len(w); i++ {
					same = w[i] == g[i]
				}
			case float64:
				var w float64
				same = json.Unmarshal(rawv, &w) == nil && w == g
			case string:
				var w string
				same = json.Unmarshal(rawv, &w) == nil && w == g
			case uint64:
				var w uint64
				same = json.Unmarshal(rawv, &w) == nil && w == g
			case int64:
				var w int64
				same = json.Unmarshal(rawv, &w) == nil && w == g
			}
			if !same {
				t.Errorf("%s: %s = %v, vector says %s", v.Name, k, got, rawv)
			}
		}
	}
}

// checkRefused checks a well-formed CALL the daemon refuses in the
// vector's context: decoding or CheckCall gives the vector's code, not
// fatal.
func checkRefused(t *testing.T, v vector, call *Call, decodeErr error) {
	t.Helper()
	err := decodeErr
	if err == nil {
		if call == nil {
			t.Errorf("%s: refused vector is not a CALL", v.Name)
			return
		}
		version := Version
		if v.Context.ConnectionVersion != 0 {
			version = v.Context.ConnectionVersion
		}
		_, err = CheckCall(call, CallLimits{Version: version, WorldSize: v.Context.WorldSize, WorldRank: v.Context.WorldRank, InlineLimit: 1 << 16})
	}
	var e *Error
	if !errors.As(err, &e) || e.Code.String() != v.Refused || e.Fatal {
		t.Errorf("%s (%s): %v, want a non-fatal %s", v.Name, v.Rule, err, v.Refused)
	}
}
