package main

// defaultPrewarm is bench's --prewarm, the same as bench/compare's: at a
// few tens of microseconds per one-element call on two CPUs, well past
// the slow start below (about 0.2 s), and about a second on larger
// worlds, whose calls take longer.
const defaultPrewarm = 5000

// prewarmer returns a func that makes n untimed calls before the first
// size, each the smallest call of the collective measured (one element,
// or one per rank for reduce_scatter) on zeros, so that sums stay exact,
// or nil for n = 0. For the first ~0.2 s after a world's processes start,
// every call runs up to twice as slow as later, whatever its size; a
// world that was started and left idle for a second first does not
// (docs/TUNING.md, section 22). Per-size warmup counts cannot cover that
// for small sizes without making every size's warmup long, so it is paid
// once, on the cheapest call there is.
func prewarmer(n int, call func() error) func() error {
	if n <= 0 {
		return nil
	}
	return func() error {
		for i := 0; i < n; i++ {
			if err := call(); err != nil {
				return err
			}
		}
		return nil
	}
}

// firstOnly is prewarm for the i-th size of a sweep: only the first runs it.
func firstOnly(i int, prewarm func() error) func() error {
	if i > 0 {
		return nil
	}
	return prewarm
}
