package collectived_test

import (
	"errors"
	"fmt"
	"log"
	"time"

	collectived "github.com/collectived/collectived/clients/go"
)

// Allreduce a gradient: every trainer ends with the sum over all trainers.
// (Here the world is one trainer, so the sum is the input.)
func Example() {
	c, err := collectived.Dial(collectived.Options{LocalRank: -1, Label: "example"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	grad := []float32{1, 2, 3}
	if err := collectived.AllReduce(c, grad, collectived.Sum); err != nil {
		log.Fatal(err)
	}
	fmt.Println("rank", c.Rank(), "of", c.Size(), "got", grad)
	// Output: rank 0 of 1 got [1 2 3]
}

// Large buffers belong in shared memory: the call then sends only where
// the buffer is, and the daemon reduces it in place.
func ExampleAllocSlice() {
	c, err := collectived.Dial(collectived.Options{LocalRank: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	weights, seg, err := collectived.AllocSlice[float64](c, 1<<20)
	if err != nil {
		log.Fatal(err)
	}
	defer seg.Free()
	for i := range weights {
		weights[i] = 0.5
	}
	if err := collectived.AllReduce(c, weights, collectived.Max); err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(weights), weights[0])
	// Output: 1048576 0.5
}

// Several calls may be in flight; each handle's Wait returns its outcome.
func ExampleAllReduceAsync() {
	c, err := collectived.Dial(collectived.Options{LocalRank: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	a, b := []int64{7}, []int64{9}
	ha, err := collectived.AllReduceAsync(c, a, collectived.Sum)
	if err != nil {
		log.Fatal(err)
	}
	hb, err := collectived.AllReduceAsync(c, b, collectived.Min)
	if err != nil {
		log.Fatal(err)
	}
	if err := errors.Join(ha.Wait(), hb.Wait()); err != nil {
		log.Fatal(err)
	}
	fmt.Println(a[0], b[0], "in order:", ha.Seq()+1 == hb.Seq())
	// Output: 7 9 in order: true
}

// Calls started together, each handled as it completes, with no goroutine
// waiting for any of them: Then's function runs once the result is in the
// bucket (it sends the bucket's index on a channel with room for all).
func ExampleHandle_Then() {
	c, err := collectived.Dial(collectived.Options{LocalRank: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	buckets := [][]float32{{1, 2}, {3}, {4, 5, 6}}
	ready := make(chan int, len(buckets))
	for i, bucket := range buckets {
		h, err := collectived.AllReduceAsync(c, bucket, collectived.Sum)
		if err != nil {
			log.Fatal(err)
		}
		h.Then(func(err error) {
			if err != nil {
				log.Fatal(err)
			}
			ready <- i
		})
	}
	sum := float32(0)
	for range buckets {
		for _, x := range buckets[<-ready] {
			sum += x
		}
	}
	fmt.Println(sum)
	// Output: 21
}

// A future: a channel that receives the call's outcome once.
func ExampleHandle_Future() {
	c, err := collectived.Dial(collectived.Options{LocalRank: -1})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	x := []int32{42}
	h, err := collectived.AllReduceAsync(c, x, collectived.Max)
	if err != nil {
		log.Fatal(err)
	}
	select {
	case err := <-h.Future():
		fmt.Println(x[0], err)
	case <-time.After(time.Minute):
		log.Fatal("no answer")
	}
	// Output: 42 <nil>
}
