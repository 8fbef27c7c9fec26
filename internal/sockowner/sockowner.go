package sockowner

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// tcpStates names the kernel's TCP states (include/net/tcp_states.h) as
// /proc/net/tcp numbers them.
var tcpStates = map[string]string{
	"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
	"05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
	"09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}

// socket is one line of /proc/net/tcp{,6} whose local port matched.
type socket struct {
	state string
	inode string
}

// TCP describes who holds local TCP port port: each socket bound to it,
// by state, and the process owning it ("pid 12 (collectived)"), or
// "unknown" and why. A connection's source port counts: a dial from the
// ephemeral range holds its port as surely as a listener does.
func TCP(port int) string {
	var socks []socket
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		s, err := scanTCP(f, port)
		if err != nil {
			return fmt.Sprintf("unknown (%v)", err)
		}
		socks = append(socks, s...)
	}
	if len(socks) == 0 {
		return "unknown (no socket on the port in /proc/net/tcp or tcp6 now: it may have been released)"
	}
	owners := fdOwners()
	var out []string
	for _, s := range socks {
		who := "a process this user cannot see"
		if s.inode == "0" {
			who = "no process (the kernel keeps it until the state ends)"
		} else if o, ok := owners[s.inode]; ok {
			who = o
		}
		out = append(out, fmt.Sprintf("%s socket of %s", s.state, who))
	}
	sort.Strings(out)
	return strings.Join(dedup(out), "; ")
}

// scanTCP returns the sockets in file whose local port is port.
func scanTCP(file string, port int) ([]socket, error) {
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return nil, nil // no IPv6 on this machine
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", port)
	var out []socket
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || !strings.HasSuffix(fs[1], want) {
			continue
		}
		st, ok := tcpStates[fs[3]]
		if !ok {
			st = "state " + fs[3]
		}
		out = append(out, socket{state: st, inode: fs[9]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	return out, nil
}

// fdOwners maps socket inodes to "pid N (comm)" for every process whose
// fds this user may read.
func fdOwners() map[string]string {
	owners := map[string]string{}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		link, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(link, "socket:[") {
			continue
		}
		inode := strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")
		if _, ok := owners[inode]; ok {
			continue
		}
		pid, err := strconv.Atoi(strings.Split(fd, "/")[2])
		if err == nil {
			owners[inode] = Process(pid)
		}
	}
	return owners
}

// Process names a process: "pid N (comm)", or "pid N" if its name cannot
// be read.
func Process(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(b)))
}

func dedup(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}
