package ring

import (
	"net"
	"strings"
	"testing"
	"time"
)

func TestConfigVerify(t *testing.T) {
	if err := DefaultConfig().Verify(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	cases := map[string]func(*Config){
		"size 0":                  func(c *Config) { c.Size = 0 },
		"rank 3 outside world":    func(c *Config) { c.Rank = 3; c.Size = 3 },
		"rank -1":                 func(c *Config) { c.Rank = -1 },
		"segment_bytes 100":       func(c *Config) { c.SegmentBytes = 100 },
		"segment_bytes 8":         func(c *Config) { c.SegmentBytes = 8 },
		"segment_bytes 134217728": func(c *Config) { c.SegmentBytes = 128 << 20 },
		"small_bytes -1":          func(c *Config) { c.SmallBytes = -1 },
		"small_bytes 2097152":     func(c *Config) { c.SmallBytes = 2 << 20 },
		"small_bytes 65544":       func(c *Config) { c.SmallBytes = directBytes + 8 },
		"op_timeout 0s":           func(c *Config) { c.OpTimeout = 0 },
		"heartbeat_interval 0s":   func(c *Config) { c.HeartbeatInterval = 0 },
		"heartbeat_timeout 1s":    func(c *Config) { c.HeartbeatTimeout = time.Second },
		"max_gather_bytes 0":      func(c *Config) { c.MaxGatherBytes = 0 },
		"socket_buffer -1":        func(c *Config) { c.SocketBuffer = -1 },
		"abort_wait 0s":           func(c *Config) { c.AbortWait = 0 },
		"stripe_bytes -1":         func(c *Config) { c.StripeBytes = -1 },
		"spin 20ms":               func(c *Config) { c.Spin = 20 * time.Millisecond },
		"spin -1ns":               func(c *Config) { c.Spin = -1 },
	}
	for want, mutate := range cases {
		c := DefaultConfig()
		mutate(&c)
		err := c.Verify()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
		if _, nerr := New(c, Links{}); nerr == nil {
			t.Errorf("%s: New accepted the config", want)
		}
	}
}

func TestNewRejectsBadLinks(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c, d := net.Pipe()
	defer c.Close()
	defer d.Close()
	cfg := testConfig(0, 2)
	cases := map[string]Links{
		"0 next and 0 prev":                    {},
		"2 next and 1 prev":                    {Next: []net.Conn{a, c}, Prev: []net.Conn{b}},
		"next stream 0 is nil":                 {Next: []net.Conn{nil}, Prev: []net.Conn{b}},
		"prev stream 0 is nil":                 {Next: []net.Conn{a}, Prev: []net.Conn{nil}},
		"prev stream 0 is the same connection": {Next: []net.Conn{a}, Prev: []net.Conn{a}},
		"next stream 1 is the same connection": {Next: []net.Conn{a, a}, Prev: []net.Conn{b, d}},
	}
	for want, l := range cases {
		_, err := New(cfg, l)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

func TestCallsBeforeStartAndBadArgs(t *testing.T) {
	rings := newWorld(t, worldOpts{n: 2})
	if _, err := rings[0].Start(); err == nil || !strings.Contains(err.Error(), "already started") {
		t.Errorf("second Start: %v", err)
	}
	links := pipeLinks(2, 1)
	r, err := New(testConfig(0, 2), links[0])
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.Barrier(barrierDesc); err == nil || !strings.Contains(err.Error(), "call Start first") {
		t.Errorf("op before Start: %v", err)
	}
	bad := []struct {
		want string
		call func() error
	}{
		{"allreduce called with a broadcast description", func() error { return rings[0].AllReduce(bcastDesc(4), make([]byte, 4)) }},
		{"buffer is 3 bytes", func() error { return rings[0].AllReduce(arDesc1, make([]byte, 3)) }},
		{"root 2 outside world", func() error { d := bcastDesc(4); d.Root = 2; return rings[0].Broadcast(d, make([]byte, 4)) }},
		{"needs a reduce op", func() error { d := arDesc1; d.Reduce = 0; return rings[0].AllReduce(d, make([]byte, 4)) }},
		{"barrier takes no count", func() error { d := barrierDesc; d.Count = 1; return rings[0].Barrier(d) }},
	}
	for _, b := range bad {
		if err := b.call(); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: got %v", b.want, err)
		}
	}
	// Argument errors leave the ring healthy.
	if err := rings[0].Err(); err != nil {
		t.Fatalf("argument error failed the ring: %v", err)
	}
	noErrors(t, "barrier after bad args", onAll(t, rings, func(i int, r *Ring) error { return r.Barrier(barrierDesc) }))
}
