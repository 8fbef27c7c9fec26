package rendezvous

import "testing"

// BenchmarkReform measures one re-formation of a ring of three with two
// streams per link on loopback: what a ring failure costs before the next
// generation can run, handshakes and all.
func BenchmarkReform(b *testing.B) {
	b.ReportAllocs()
	lns, peers := freeListeners(b, 3)
	ls := make([]*Listener, 3)
	for r := range ls {
		cfg := testConfig(b, peers, r, 2)
		l, err := NewListener(cfg, lns[r])
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		ls[r] = l
	}
	gens := []uint32{1, 1, 1}
	b.ResetTimer()
	for range b.N {
		links, errs := formAll(ls, gens)
		for r, err := range errs {
			if err != nil {
				b.Fatalf("rank %d: %v", r, err)
			}
		}
		for _, k := range links {
			k.Close()
		}
	}
}
