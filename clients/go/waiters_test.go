package collectived_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	collectived "github.com/collectived/collectived/clients/go"
)

// Goroutines sharing a client each wait for their own calls: whoever
// holds the read token delivers the others' replies and passes it on, so
// every call completes with its own result, whatever order the waits run
// in.
func TestConcurrentWaiters(t *testing.T) {
	c := dial(t)
	const goroutines, calls = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < calls; k++ {
				x := []float32{float32(g), float32(k)}
				h, err := collectived.AllReduceAsync(c, x, collectived.Sum)
				if err != nil {
					errs <- err
					return
				}
				if k%3 == 0 {
					time.Sleep(time.Millisecond) // let another goroutine read for us
				}
				if err := h.Wait(); err != nil {
					errs <- fmt.Errorf("goroutine %d call %d: %w", g, k, err)
					return
				}
				// A world of one: the sum is the buffer itself.
				if x[0] != float32(g) || x[1] != float32(k) {
					errs <- fmt.Errorf("goroutine %d call %d: got %v", g, k, x)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// With no goroutine waiting, Done reads the replies that have arrived: an
// async call is seen done without Wait, and Wait then returns at once.
func TestDoneWithoutWait(t *testing.T) {
	c := dial(t)
	x := []float64{1.5, 2.5}
	h, err := collectived.AllReduceAsync(c, x, collectived.Sum)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !h.Done() {
		if time.Now().After(deadline) {
			t.Fatal("Done never reported the reply, with nobody else reading")
		}
		time.Sleep(100 * time.Microsecond)
	}
	if err := h.Wait(); err != nil || x[0] != 1.5 || x[1] != 2.5 {
		t.Fatalf("Wait after Done: %v %v", err, x)
	}
}
