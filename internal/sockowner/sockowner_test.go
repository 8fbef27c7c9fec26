package sockowner

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/collectived/collectived/internal/localworld"
)

// A port this process listens on is named with this process and LISTEN;
// a connection's own port counts too.
func TestTCPNamesTheListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	me := fmt.Sprintf("pid %d (", os.Getpid())
	if got := TCP(port); !strings.Contains(got, "LISTEN socket of "+me) {
		t.Errorf("TCP(%d) = %q, want our LISTEN socket, %s...)", port, got, me)
	}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src := c.LocalAddr().(*net.TCPAddr).Port
	if got := TCP(src); !strings.Contains(got, "ESTABLISHED socket of "+me) {
		t.Errorf("TCP(%d), a dial's source port = %q, want our ESTABLISHED socket", src, got)
	}
}

// A port nobody holds is "unknown" with the reason. The port comes from
// outside the ephemeral range, so no dial takes it once released; but a
// listener of another test may have had it a moment ago, and the kernel
// keeps its closed connections in TIME_WAIT on it (bindable, yet held):
// such a port is not one nobody holds, and another is tried.
func TestTCPUnknown(t *testing.T) {
	for try := 0; try < 20; try++ {
		ls, err := localworld.Listeners(1)
		if err != nil {
			t.Fatal(err)
		}
		port := ls[0].Addr().(*net.TCPAddr).Port
		ls[0].Close()
		got := TCP(port)
		switch {
		case strings.HasPrefix(got, "unknown ("):
			return
		case strings.HasPrefix(got, "TIME_WAIT socket of no process"):
			continue
		}
		t.Fatalf("TCP(%d) of a closed listener = %q, want unknown and why", port, got)
	}
	t.Fatal("20 ports in a row were held in TIME_WAIT")
}

func TestProcess(t *testing.T) {
	if got, want := Process(os.Getpid()), fmt.Sprintf("pid %d (", os.Getpid()); !strings.HasPrefix(got, want) {
		t.Errorf("Process(self) = %q, want %s...)", got, want)
	}
	if got := Process(-1); got != "pid -1" {
		t.Errorf("Process(-1) = %q", got)
	}
}
