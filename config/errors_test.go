package config

import (
	"errors"
	"strings"
	"testing"
)

// Every way a file can be wrong, each expecting the file, line, key and
// message.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		want string
	}{
		// Structure.
		{"empty file", "", "config.yaml:1: config is empty"},
		{"only comments", "# nothing\n", "config.yaml:1: config is empty"},
		{"null document", "~\n", "config.yaml:1: config is empty"},
		{"top level list", "- a\n- b\n", "config.yaml:1: the top level must be a mapping of keys (job:, peers:, ...), not a list"},
		{"two documents", base + "---\njob:\n  name: other\n", "config.yaml:7: a second YAML document starts here; a config is exactly one document"},
		{"syntax error", "job:\n  name: demo\n bad: [\n", "config.yaml:2: YAML syntax: did not find expected key"},
		{"tab indent", "job:\n\tname: demo\n", "config.yaml:2: YAML syntax:"},
		{"unknown top key", base + "peer: x\n", `config.yaml:7: peer: unknown key (did you mean "peers"? the top level takes: job, peers, rank, listen, socket, timeouts, ring, fusion, limits, log)`},
		{"unknown nested key", base + "timeouts:\n  conect: 1s\n", `config.yaml:8: timeouts.conect: unknown key (did you mean "connect"? timeouts takes: connect, collective,`},
		{"unknown key no hint", base + "ring:\n  transport: tcp\n", "config.yaml:8: ring.transport: unknown key (ring takes: streams, segment_bytes, small_bytes, spin)"},
		{"unknown quoted key", base + "\"a b\": 1\n", `config.yaml:7: "a b": unknown key`},
		{"repeated key", base + "rank: 0\nrank: 1\n", "config.yaml:8: rank: repeated; it was first set at line 7"},
		{"merge key", base + "x: &x {streams: 2}\n", "config.yaml:7: x: unknown key"},
		{"merge key in section", base + "ring:\n  <<: {streams: 2}\n", "config.yaml:8: ring: merge keys (<<) are not supported"},
		{"non-scalar key", base + "? [a]\n: 1\n", "config.yaml:7: a key must be a plain word, not a list"},

		// Types.
		{"section not mapping", base + "timeouts: 5\n", "config.yaml:7: timeouts: must be a mapping of keys (connect, collective, first_call, stall_warning, hello, heartbeat, heartbeat_timeout), not the integer 5"},
		{"job not mapping", "job: demo\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:1: job: must be a mapping of keys"},
		{"name not string", "job:\n  name: true\n  token_env: T\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:2: job.name: must be a string, not the boolean true (quote it if a string was meant)"},
		{"name is list", "job:\n  name: [a]\n  token_env: T\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:2: job.name: must be a string, not a list"},
		{"repeated section", base + "job:\n", "config.yaml:7: job: repeated; it was first set at line 1"},
		{"local_size not int", "job:\n  name: demo\n  token_env: T\n  local_size: two\npeers: [\"127.0.0.1:1\"]\n", `config.yaml:4: job.local_size: must be an integer, not the string "two"`},
		{"local_size float", "job:\n  name: demo\n  token_env: T\n  local_size: 1.5\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:4: job.local_size: must be an integer, not the number 1.5"},
		{"local_size leading zero", "job:\n  name: demo\n  token_env: T\n  local_size: 010\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:4: job.local_size: 010 has a leading zero"},
		{"local_size huge", "job:\n  name: demo\n  token_env: T\n  local_size: 9999999999\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:4: job.local_size: 9999999999 is out of range"},
		{"no value", base + "timeouts:\n  connect:\n", "config.yaml:8: timeouts.connect: has no value; give a duration"},
		{"peers not list", "job:\n  name: demo\n  token_env: T\npeers: 127.0.0.1:1\n", `config.yaml:4: peers: must be a list of host:port addresses, not the string "127.0.0.1:1"`},
		{"peer not string", "job:\n  name: demo\n  token_env: T\npeers:\n  - 127.0.0.1:1\n  - 7101\n", "config.yaml:6: peers[1]: must be a string, not the integer 7101"},
		{"rank word", base + "rank: first\n", `config.yaml:7: rank: the string "first" is neither an integer nor "auto"`},
		{"rank float", base + "rank: 1.5\n", `config.yaml:7: rank: the number 1.5 is neither an integer nor "auto"`},
		{"rank AUTO", base + "rank: AUTO\n", `config.yaml:7: rank: the string "AUTO" is neither an integer nor "auto"`},
		{"duration bad", base + "timeouts:\n  collective: 5x\n", `config.yaml:8: timeouts.collective: "5x" is not a duration`},
		{"duration int", base + "timeouts:\n  collective: 10\n", `config.yaml:8: timeouts.collective: the integer 10 is not a duration: give a unit, e.g. "10s"`},
		{"size bad unit", base + "ring:\n  small_bytes: 1PiB\n", `config.yaml:8: ring.small_bytes: "1PiB" is not a size: unknown unit "PiB"`},
		{"size ambiguous K", base + "ring:\n  small_bytes: 4K\n", `config.yaml:8: ring.small_bytes: "4K" is not a size: unknown unit "K"`},
		{"size negative", base + "ring:\n  small_bytes: -1\n", "config.yaml:8: ring.small_bytes: -1 is negative"},
		{"size float", base + "limits:\n  inline_bytes: 1.5\n", `config.yaml:8: limits.inline_bytes: must be a whole number of bytes or a string like "64KiB", not the number 1.5`},
		{"size word", base + "limits:\n  inline_bytes: lots\n", `config.yaml:8: limits.inline_bytes: "lots" is not a size`},
		{"size overflow", base + "limits:\n  shm_quota_bytes: 99999999999TiB\n", `config.yaml:8: limits.shm_quota_bytes: "99999999999TiB" is too large`},
		{"mode not octal", base + "socket:\n  mode: \"0x1b0\"\n", `config.yaml:8: socket.mode: "0x1b0" is not an octal mode`},
		{"mode digit 9", base + "socket:\n  mode: \"0990\"\n", `config.yaml:8: socket.mode: "0990" is not an octal mode`},
		{"mode bool", base + "socket:\n  mode: true\n", `config.yaml:8: socket.mode: must be an octal mode like "0660", not the boolean true`},
		{"mode extra bits", base + "socket:\n  mode: \"4660\"\n", "config.yaml:8: socket.mode: 04660 has bits beyond 0777"},
		{"mode no owner rw", base + "socket:\n  mode: \"0460\"\n", "config.yaml:8: socket.mode: 0460 lacks owner read and write"},
		{"uid negative", base + "socket:\n  allowed_uids: [1000, -1]\n", "config.yaml:8: socket.allowed_uids[1]: the integer -1 is not a numeric uid (0 to 4294967294)"},
		{"uid name", base + "socket:\n  allowed_uids:\n    - root\n", `config.yaml:9: socket.allowed_uids[0]: the string "root" is not a numeric uid`},
		{"uid max", base + "socket:\n  allowed_gids: [4294967295]\n", "config.yaml:8: socket.allowed_gids[0]: the integer 4294967295 is not a numeric gid"},
		{"uids not list", base + "socket:\n  allowed_uids: 1000\n", "config.yaml:8: socket.allowed_uids: must be a list of numeric uids, not the integer 1000"},

		// Values.
		{"empty job name", "job:\n  name: \"\"\n  token_env: T\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:2: job.name: is empty"},
		{"missing job name", "job:\n  token_env: T\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:1: job.name: is empty"},
		{"missing job", "peers: [\"127.0.0.1:1\"]\n", "config.yaml:1: job.name: is empty"},
		{"bad job name", "job:\n  name: my job\n  token_env: T\npeers: [\"127.0.0.1:1\"]\n", `config.yaml:2: job.name: "my job" may hold only letters, digits`},
		{"long job name", "job:\n  name: " + strings.Repeat("a", 65) + "\n  token_env: T\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:2: job.name: is 65 bytes long; at most 64"},
		{"local_size 0", "job:\n  name: demo\n  token_env: T\n  local_size: 0\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:4: job.local_size: 0 is out of range: 1 to 1024"},
		{"local_size 1025", "job:\n  name: demo\n  token_env: T\n  local_size: 1025\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:4: job.local_size: 1025 is out of range: 1 to 1024"},
		{"both tokens", "job:\n  name: demo\n  token_env: T\n  token_file: /t\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:1: job: sets both token_file and token_env"},
		{"neither token", "job:\n  name: demo\npeers: [\"127.0.0.1:1\"]\n", "config.yaml:1: job: needs the job token"},
		{"relative token file", "job:\n  name: demo\n  token_file: token\npeers: [\"127.0.0.1:1\"]\n", `config.yaml:3: job.token_file: "token" is not an absolute path`},
		{"bad env name", "job:\n  name: demo\n  token_env: 1TOK\npeers: [\"127.0.0.1:1\"]\n", `config.yaml:3: job.token_env: "1TOK" is not an environment variable name`},
		{"no peers", "job:\n  name: demo\n  token_env: T\npeers: []\n", "config.yaml:4: peers: no peers"},
		{"missing peers", "job:\n  name: demo\n  token_env: T\n", "config.yaml:1: peers: no peers"},
		{"duplicate peer", base + "", ""}, // replaced below
		{"peer not host:port", "job:\n  name: demo\n  token_env: T\npeers:\n  - 127.0.0.1\n", `config.yaml:5: peers[0]: "127.0.0.1" is not host:port`},
		{"peer ipv6 unbracketed", "job:\n  name: demo\n  token_env: T\npeers:\n  - ::1:7000\n", `config.yaml:5: peers[0]: "::1:7000" is not host:port (write an IPv6 address as [::1]:7070)`},
		{"peer bad host", "job:\n  name: demo\n  token_env: T\npeers:\n  - \"http://node1:7000\"\n", `config.yaml:5: peers[0]: "http://node1:7000" is not host:port`},
		{"peer host with space", "job:\n  name: demo\n  token_env: T\npeers:\n  - \"node 1:7000\"\n", `config.yaml:5: peers[0]: "node 1:7000": host "node 1" is neither an IP address nor a host name`},
		{"peer no host", "job:\n  name: demo\n  token_env: T\npeers:\n  - :7000\n", `config.yaml:5: peers[0]: ":7000" has no host`},
		{"peer port 0", "job:\n  name: demo\n  token_env: T\npeers:\n  - 127.0.0.1:0\n", `config.yaml:5: peers[0]: "127.0.0.1:0": port 0 is out of range 1-65535`},
		{"peer port 65536", "job:\n  name: demo\n  token_env: T\npeers:\n  - 127.0.0.1:65536\n", `config.yaml:5: peers[0]: "127.0.0.1:65536": port 65536 is out of range 1-65535`},
		{"peer port name", "job:\n  name: demo\n  token_env: T\npeers:\n  - 127.0.0.1:http\n", `config.yaml:5: peers[0]: "127.0.0.1:http": port "http" is not a number`},
		{"peer port signed", "job:\n  name: demo\n  token_env: T\npeers:\n  - 127.0.0.1:+80\n", `port "+80" is not a number`},
		{"peer unspecified", "job:\n  name: demo\n  token_env: T\npeers:\n  - 0.0.0.0:7000\n", `config.yaml:5: peers[0]: "0.0.0.0:7000" cannot be dialed`},
		{"loopback mix", "job:\n  name: demo\n  token_env: T\npeers:\n  - 10.0.0.1:7000\n  - 127.0.0.1:7000\n", `config.yaml:4: peers: mixes loopback (peers[1] "127.0.0.1:7000") and non-loopback (peers[0] "10.0.0.1:7000") addresses`},
		{"loopback mix by name", "job:\n  name: demo\n  token_env: T\npeers:\n  - localhost:7000\n  - node2:7000\n", `config.yaml:4: peers: mixes loopback (peers[0] "localhost:7000") and non-loopback (peers[1] "node2:7000")`},
		{"rank too big", base + "rank: 2\n", "config.yaml:7: rank: 2 is out of range: 2 peers give ranks 0 to 1"},
		{"rank negative", base + "rank: -1\n", "config.yaml:7: rank: -1 is out of range"},
		{"listen bad", base + "listen: 0.0.0.0\n", `config.yaml:7: listen: "0.0.0.0" is not host:port`},
		{"listen port", base + "listen: \":99999\"\n", `config.yaml:7: listen: ":99999": port 99999 is out of range 1-65535`},
		{"socket relative", base + "socket:\n  path: run/c.sock\n", `config.yaml:8: socket.path: "run/c.sock" is not an absolute path`},
		{"socket empty", base + "socket:\n  path: \"\"\n", "config.yaml:8: socket.path: is empty"},
		{"socket long", base + "socket:\n  path: /" + strings.Repeat("s", 107) + "\n", "config.yaml:8: socket.path: is 108 bytes long; a Unix socket address holds at most 107"},
		{"zero duration", base + "timeouts:\n  hello: 0s\n", "config.yaml:8: timeouts.hello: 0s is not positive"},
		{"negative duration", base + "timeouts:\n  connect: -1s\n", "config.yaml:8: timeouts.connect: -1s is not positive"},
		{"huge duration", base + "timeouts:\n  first_call: 25h\n", "config.yaml:8: timeouts.first_call: 25h0m0s is longer than 24h0m0s"},
		{"heartbeat order", base + "timeouts:\n  heartbeat: 5s\n  heartbeat_timeout: 5s\n", "config.yaml:9: timeouts.heartbeat_timeout: 5s is not longer than timeouts.heartbeat (5s)"},
		{"stall order", base + "timeouts:\n  stall_warning: 10m\n", "config.yaml:8: timeouts.stall_warning: 10m0s is not shorter than timeouts.collective (5m0s)"},
		{"streams 0", base + "ring:\n  streams: 0\n", "config.yaml:8: ring.streams: 0 is out of range: 1 to 16"},
		{"streams 17", base + "ring:\n  streams: 17\n", "config.yaml:8: ring.streams: 17 is out of range: 1 to 16"},
		{"segment small", base + "ring:\n  segment_bytes: 2KiB\n", "config.yaml:8: ring.segment_bytes: 2KiB is out of range: 4KiB to 64MiB"},
		{"segment big", base + "ring:\n  segment_bytes: 128MiB\n", "config.yaml:8: ring.segment_bytes: 128MiB is out of range: 4KiB to 64MiB"},
		{"segment odd", base + "ring:\n  segment_bytes: 4100\n", "config.yaml:8: ring.segment_bytes: 4100 is not a multiple of 8"},
		{"small big", base + "ring:\n  small_bytes: 2MiB\n", "config.yaml:8: ring.small_bytes: 2MiB is out of range: 0 to 64KiB"},
		{"small past the direct writes", base + "ring:\n  small_bytes: 65537\n", "config.yaml:8: ring.small_bytes: 65537 is out of range: 0 to 64KiB (larger buffers circulating whole measured several times slower"},
		{"spin big", base + "ring:\n  spin: 20ms\n", "config.yaml:8: ring.spin: 20ms is out of range: 0 (never poll) to 10ms"},
		{"spin negative", base + "ring:\n  spin: -1us\n", "config.yaml:8: ring.spin: -1µs is out of range"},
		{"spin no unit", base + "ring:\n  spin: 50\n", "config.yaml:8: ring.spin: the integer 50 is not a duration"},
		{"inline big", base + "limits:\n  inline_bytes: 2MiB\n", "config.yaml:8: limits.inline_bytes: 2MiB is out of range: 0 to 1MiB"},
		{"in flight 0", base + "limits:\n  max_in_flight: 0\n", "config.yaml:8: limits.max_in_flight: 0 is out of range: 1 to 65536"},
		{"segments 0", base + "limits:\n  max_segments: 0\n", "config.yaml:8: limits.max_segments: 0 is out of range: 1 to 65536 segments per client"},
		{"segments over the cap", base + "limits:\n  max_segments: 65537\n", "config.yaml:8: limits.max_segments: 65537 is out of range: 1 to 65536 segments per client"},
		{"fusion threshold", base + "fusion:\n  threshold_bytes: 2GiB\n", "config.yaml:8: fusion.threshold_bytes: 2GiB is out of range: 0 (no fusion) to 1GiB"},
		{"fusion cycle", base + "fusion:\n  cycle: 2s\n", "config.yaml:8: fusion.cycle: 2s is out of range: 0 to 1s"},
		{"fusion key", base + "fusion:\n  threshold: 1MiB\n", "config.yaml:8: fusion.threshold: unknown key"},
		{"clients 0", base + "limits:\n  max_clients: 0\n", "config.yaml:8: limits.max_clients: 0 is out of range: 1 to 65536"},
		{"clients below local size", "job:\n  name: demo\n  token_env: T\n  local_size: 8\npeers: [\"127.0.0.1:1\"]\nlimits:\n  max_clients: 4\n", "config.yaml:7: limits.max_clients: 4 is below job.local_size (8)"},
		{"log level", base + "log:\n  level: verbose\n", `config.yaml:8: log.level: "verbose" is not a level: debug, info, warn or error`},
		{"log format", base + "log:\n  format: xml\n", `config.yaml:8: log.format: "xml" is not a format: text or json`},
	} {
		if tc.name == "duplicate peer" {
			tc.src = "job:\n  name: demo\n  token_env: T\npeers:\n  - 127.0.0.1:7000\n  - 127.0.0.2:7000\n  - \"[::ffff:127.0.0.2]:7000\"\n"
			tc.want = `config.yaml:7: peers[2]: "[::ffff:127.0.0.2]:7000" repeats peers[1] ("127.0.0.2:7000")`
		}
		t.Run(tc.name, func(t *testing.T) { mustFail(t, tc.src, tc.want) })
	}
}

func TestUnknownKeyIsSentinel(t *testing.T) {
	err := mustFail(t, base+"typo: 1\n")
	if !errors.Is(err, ErrUnknownKey) {
		t.Errorf("errors.Is(%v, ErrUnknownKey) = false", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != 7 || e.Key != "typo" || e.Source != "config.yaml" {
		t.Errorf("error fields = %+v", e)
	}
}

// All problems come back at once, in line order, without echoes of a
// value that did not parse.
func TestParseReportsEveryError(t *testing.T) {
	src := `job:
  name: demo
  token_file: 5
peers:
  - 127.0.0.1:7101
  - 7102
rank: 7
timeouts:
  connect: soon
  hello: 0s
log:
  level: loud
`
	err := mustFail(t, src)
	var list ErrorList
	errors.As(err, &list)
	var got []string
	for _, e := range list {
		got = append(got, e.Error())
	}
	want := []string{
		"config.yaml:3: job.token_file: must be a string, not the integer 5 (quote it if a string was meant)",
		"config.yaml:6: peers[1]: must be a string, not the integer 7102 (quote it if a string was meant)",
		`config.yaml:9: timeouts.connect: "soon" is not a duration (e.g. "500ms", "10s", "5m", "1h")`,
		"config.yaml:10: timeouts.hello: 0s is not positive; every wait needs a finite timeout above zero",
		`config.yaml:12: log.level: "loud" is not a level: debug, info, warn or error`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A config built in code has no lines; its errors still name the key.
func TestValidateWithoutSource(t *testing.T) {
	c := Default()
	c.Job.Name, c.Job.TokenEnv = "demo", "T"
	c.Peers = []string{"10.0.0.1:1", "10.0.0.1:1"}
	c.Ring.Streams = 0
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate succeeded")
	}
	want := `peers[1]: "10.0.0.1:1" repeats peers[0] ("10.0.0.1:1"); each node appears once` + "\n" +
		"ring.streams: 0 is out of range: 1 to 16 TCP streams per link"
	if err.Error() != want {
		t.Errorf("Validate:\n%v\nwant:\n%s", err, want)
	}
}

func TestErrorFormat(t *testing.T) {
	for _, tc := range []struct {
		e    Error
		want string
	}{
		{Error{Source: "c.yaml", Line: 3, Key: "k", Err: errors.New("bad")}, "c.yaml:3: k: bad"},
		{Error{Source: "c.yaml", Key: "k", Err: errors.New("bad")}, "c.yaml: k: bad"},
		{Error{Line: 3, Key: "k", Err: errors.New("bad")}, "line 3: k: bad"},
		{Error{Source: "c.yaml", Line: 3, Err: errors.New("bad")}, "c.yaml:3: bad"},
	} {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}
