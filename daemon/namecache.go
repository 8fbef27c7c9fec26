package daemon

import (
	"slices"

	"github.com/collectived/collectived/collective"
)

// nameCache is the response cache of named calls, after Horovod's: a
// name that has run once gets a bit, and a node that has it ready again
// with the same description offers that bit instead of an entry, so that
// a training step's repeating set of names fits one round however many
// there are.
//
// Every node builds the same cache: names are added, in the order they
// ran, only from a round's result, which every node computes alike; a
// round checks that the nodes' caches agree in size (decodeRound).
// Invalidation: a name called again with another description travels as
// an entry, and once it has run its bit describes the new call
// (invalidations counts these); a new ring generation (after any failure:
// a trainer lost, a node restarted) empties the cache on every node.
type nameCache struct {
	entries  []cacheEntry
	index    map[string]int
	assigned uint64 // names given or re-given a bit since the cache was emptied

	// Counters since the daemon started, for status.
	hits, misses, invalidations uint64
}

type cacheEntry struct {
	desc     collective.Desc
	hash, fp uint64
}

func (e cacheEntry) offer(i int) offer {
	d := &e.desc
	return offer{hash: e.hash, fp: e.fp, count: d.Count, root: d.Root, op: d.Op, dtype: d.DType, reduce: d.Reduce,
		name: d.Name, cached: true, cacheIndex: i}
}

// lookup returns the bit of d's name if the cache holds it with d's
// description.
func (c *nameCache) lookup(d collective.Desc) (int, bool) {
	i, ok := c.index[d.Name]
	if !ok || c.entries[i].fp != d.Fingerprint() {
		return 0, false
	}
	return i, true
}

// record notes that d ran (every node records the same names in the same
// order); cached tells whether this node offered it as a bit.
func (c *nameCache) record(d collective.Desc, cached bool) {
	if cached {
		c.hits++
		return
	}
	c.misses++
	fp := d.Fingerprint()
	d.Counts = slices.Clone(d.Counts) // the request's storage is reused
	if i, ok := c.index[d.Name]; ok {
		c.entries[i] = cacheEntry{desc: d, hash: nameHash(d.Name), fp: fp}
		c.invalidations++
		c.assigned++
		return
	}
	if len(c.entries) == cacheBits {
		return // full: later names travel as entries
	}
	if c.index == nil {
		c.index = make(map[string]int)
	}
	c.index[d.Name] = len(c.entries)
	c.entries = append(c.entries, cacheEntry{desc: d, hash: nameHash(d.Name), fp: fp})
	c.assigned++
}

// reset empties the cache: a new generation begins.
func (c *nameCache) reset() {
	clear(c.entries)
	c.entries = c.entries[:0]
	clear(c.index)
	c.assigned = 0
}
