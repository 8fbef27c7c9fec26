package rendezvous

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// A ring forms while every listener is fed garbage, replayed handshakes
// and half-open connections; each kind of junk is refused by name and the
// ring is wired all the same.
func TestFormUnderAttack(t *testing.T) {
	const n, streams = 3, 2
	w := newWorld(t, n, streams, func(c *Config) { c.HandshakeTimeout = time.Second })

	// A recorded hello for each listener, to replay: made by a genuine
	// handshake that the listener refused because it was not yet forming.
	recorded := make([][]byte, n)
	for r := range n {
		p := craft(t, w.peers, (r-1+n)%n)
		p.cfg.Streams, p.hello.Streams = streams, streams
		rec := &recorder{}
		c, err := net.Dial("tcp", w.peers[r])
		if err != nil {
			t.Fatal(err)
		}
		rec.Conn = c
		c.SetDeadline(time.Now().Add(5 * time.Second))
		dialHandshake(rec, p)
		c.Close()
		recorded[r] = bytes.Clone(rec.sent.Bytes())
	}

	ctx, stop := context.WithCancel(context.Background())
	var attackers sync.WaitGroup
	for r := range n {
		addr := w.peers[r]
		attackers.Go(func() { // garbage
			for ctx.Err() == nil {
				if c, err := net.Dial("tcp", addr); err == nil {
					c.Write([]byte("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello, not ours"))
					c.Close()
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		attackers.Go(func() { // replay
			for ctx.Err() == nil {
				if c, err := net.Dial("tcp", addr); err == nil {
					c.Write(recorded[r])
					c.SetReadDeadline(time.Now().Add(time.Second))
					c.Read(make([]byte, 512))
					c.Close()
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		attackers.Go(func() { // two half-open connections at all times
			var held []net.Conn
			for ctx.Err() == nil {
				for len(held) < 2 {
					c, err := net.Dial("tcp", addr)
					if err != nil {
						break
					}
					held = append(held, c)
				}
				time.Sleep(750 * time.Millisecond) // each lives past the handshake deadline
				held[0].Close()
				held = held[1:]
			}
			for _, c := range held {
				c.Close()
			}
		})
	}
	defer func() { stop(); attackers.Wait() }()

	// Let the attack get going before the ring forms, then form it twice.
	for _, rj := range w.rejects {
		rj.waitFor(t, ErrBadMagic, 5*time.Second)
		rj.waitFor(t, ErrReplay, 5*time.Second)
	}
	var links []*Links
	for g := uint32(1); g <= 2; g++ {
		gens := gensOf(n, func(int) uint32 { return g })
		links = mustFormAll(t, w.ls, gens)
		checkWired(t, w.peers, links, gens, streams)
		if g == 1 {
			for _, k := range links {
				k.Close()
			}
		}
	}
	// The formed ring keeps working while the attack goes on and half-open
	// connections time out around it.
	for _, rj := range w.rejects {
		rj.waitFor(t, ErrHandshakeTimeout, 5*time.Second)
		rj.waitFor(t, ErrBadMagic, 5*time.Second)
	}
	checkWired(t, w.peers, links, gensOf(n, func(int) uint32 { return 2 }), streams)
}
