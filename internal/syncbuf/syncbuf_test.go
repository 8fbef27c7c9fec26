package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// Writers and a reader at once (run under -race): every write lands whole.
func TestConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				b.Write([]byte("ab"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("ab", 400) {
		t.Fatalf("got %d bytes, want 800 of \"ab\" repeated", len(got))
	}
}
