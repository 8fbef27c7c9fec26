package fdtest

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// While exhausted, the next open fails with EMFILE; after release it
// works again and the limit is what it was.
func TestExhaust(t *testing.T) {
	var before unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &before); err != nil {
		t.Fatal(err)
	}
	release, err := Exhaust()
	if err != nil {
		t.Fatal(err)
	}
	_, openErr := os.Open("/dev/null")
	release()
	if !errors.Is(openErr, unix.EMFILE) {
		t.Fatalf("open while exhausted: %v, want EMFILE", openErr)
	}
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatalf("open after release: %v", err)
	}
	f.Close()
	var after unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("limit after release %+v, want %+v", after, before)
	}
}

// ExhaustLeaving leaves exactly that many opens.
func TestExhaustLeaving(t *testing.T) {
	release, err := ExhaustLeaving(2)
	if err != nil {
		t.Fatal(err)
	}
	var errs [3]error
	for i := range errs {
		var f *os.File
		if f, errs[i] = os.Open("/dev/null"); errs[i] == nil {
			defer f.Close()
		}
	}
	release()
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], unix.EMFILE) {
		t.Fatalf("three opens with two fds left: %v; want two to succeed, the third EMFILE", errs)
	}
}
