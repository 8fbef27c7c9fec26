package rendezvous

import "sync"

// nonceCache remembers the most recent dialer nonces so that a recorded
// handshake played back is refused by name rather than only by its MAC.
// It is bounded: a flood of hellos evicts old entries, after which a
// replay still fails authentication because our nonce is fresh.
type nonceCache struct {
	mu   sync.Mutex
	seen map[[nonceLen]byte]struct{}
	ring [][nonceLen]byte
	next int
}

const nonceCacheSize = 4096

func newNonceCache() *nonceCache {
	return &nonceCache{
		seen: make(map[[nonceLen]byte]struct{}, nonceCacheSize),
		ring: make([][nonceLen]byte, 0, nonceCacheSize),
	}
}

// add records n and reports whether it was new.
func (c *nonceCache) add(n [nonceLen]byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[n]; ok {
		return false
	}
	if len(c.ring) < nonceCacheSize {
		c.ring = append(c.ring, n)
	} else {
		delete(c.seen, c.ring[c.next])
		c.ring[c.next] = n
		c.next = (c.next + 1) % nonceCacheSize
	}
	c.seen[n] = struct{}{}
	return true
}
