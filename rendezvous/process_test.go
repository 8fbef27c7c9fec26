package rendezvous

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestHelperNode is not a test: TestFormAfterProcessRestart runs the test
// binary again with it, as one node in its own process. The node forms,
// says "formed", and then relays every byte from each Prev stream to the
// same Next stream until a link breaks.
func TestHelperNode(t *testing.T) {
	peers := os.Getenv("RENDEZVOUS_HELPER_PEERS")
	if peers == "" {
		t.Skip("helper process for TestFormAfterProcessRestart")
	}
	rank, _ := strconv.Atoi(os.Getenv("RENDEZVOUS_HELPER_RANK"))
	streams, _ := strconv.Atoi(os.Getenv("RENDEZVOUS_HELPER_STREAMS"))
	cfg := testConfig(t, strings.Split(peers, ","), rank, streams)
	l, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	links, err := l.Form(context.Background(), 0) // a fresh process proposes nothing
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("formed\n")
	var wg sync.WaitGroup
	for i := range links.Prev {
		wg.Go(func() { io.Copy(links.Next[i], links.Prev[i]) })
	}
	wg.Wait()
}

// startNode runs the test binary as node `rank` and waits until it formed.
func startNode(t *testing.T, peers []string, rank, streams int, formed chan<- error) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperNode$", "-test.v")
	cmd.Env = append(os.Environ(),
		"RENDEZVOUS_HELPER_PEERS="+strings.Join(peers, ","),
		"RENDEZVOUS_HELPER_RANK="+strconv.Itoa(rank),
		"RENDEZVOUS_HELPER_STREAMS="+strconv.Itoa(streams))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) // by PID, never by name
	go func() {
		sc := bufio.NewScanner(out)
		var seen []string
		for sc.Scan() {
			if sc.Text() == "formed" {
				formed <- nil
				io.Copy(io.Discard, out)
				return
			}
			seen = append(seen, sc.Text())
		}
		formed <- fmt.Errorf("helper exited before forming; its output:\n%s", strings.Join(seen, "\n"))
	}()
	return cmd
}

// relayCheck sends a byte from rank 0 through the helper (rank 1) to rank
// 2 on every stream, and one from rank 2 straight to rank 0.
func relayCheck(t *testing.T, l0, l2 *Links, tag byte) {
	t.Helper()
	for i := range l0.Next {
		if _, err := l0.Next[i].Write([]byte{tag + byte(i)}); err != nil {
			t.Fatalf("rank 0 next stream %d: %v", i, err)
		}
		if _, err := l2.Next[i].Write([]byte{tag + 0x40 + byte(i)}); err != nil {
			t.Fatalf("rank 2 next stream %d: %v", i, err)
		}
	}
	for i := range l0.Next {
		for _, c := range []struct {
			k    *Links
			want byte
		}{{l2, tag + byte(i)}, {l0, tag + 0x40 + byte(i)}} {
			var b [1]byte
			c.k.Prev[i].SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(c.k.Prev[i], b[:]); err != nil || b[0] != c.want {
				t.Fatalf("prev stream %d: got %d, %v; want %d", i, b[0], err, c.want)
			}
		}
	}
}

// A node killed with SIGKILL and started again as a fresh process re-forms
// with the survivors, who call Form again on their old Listeners.
func TestFormAfterProcessRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	const streams = 2
	lns, peers := freeListeners(t, 3)
	lns[1].Close() // the helper process binds it
	ls := make([]*Listener, 3)
	for _, r := range []int{0, 2} {
		l, err := NewListener(testConfig(t, peers, r, streams), lns[r])
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ls[r] = l
	}
	formSurvivors := func(gen uint32) (l0, l2 *Links, helper *exec.Cmd) {
		var e0, e2 error
		var wg sync.WaitGroup
		wg.Go(func() { l0, e0 = ls[0].Form(context.Background(), gen) })
		wg.Go(func() { l2, e2 = ls[2].Form(context.Background(), gen) })
		formed := make(chan error, 1)
		helper = startNode(t, peers, 1, streams, formed)
		wg.Wait()
		if e0 != nil || e2 != nil {
			t.Fatalf("survivors: rank 0: %v; rank 2: %v", e0, e2)
		}
		select {
		case err := <-formed:
			if err != nil {
				t.Fatalf("helper node did not form: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("helper node did not report")
		}
		return l0, l2, helper
	}

	l0, l2, helper := formSurvivors(1)
	if l0.NextGeneration != 0 || l2.PrevGeneration != 0 {
		t.Fatalf("helper proposed %d/%d, want 0", l0.NextGeneration, l2.PrevGeneration)
	}
	relayCheck(t, l0, l2, 1)

	// SIGKILL the helper (by PID): the survivors see their links to it break.
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	helper.Wait()
	for _, c := range []net.Conn{l0.Next[0], l2.Prev[0]} {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatalf("link to the killed node still reads (%d bytes)", n)
		}
	}
	l0.Close()
	l2.Close()

	l0, l2, _ = formSurvivors(2)
	defer l0.Close()
	defer l2.Close()
	relayCheck(t, l0, l2, 0x80)
}
