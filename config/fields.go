package config

import (
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// field is one known key of a mapping and how to read its value.
type field struct {
	name string
	set  func(p *parser, key string, v *yaml.Node)
}

// rootFields is the schema of the file: every key, at every level, that
// collectived reads. Anything else is rejected.
func rootFields(c *Config) []field {
	return []field{
		{"job", func(p *parser, key string, v *yaml.Node) {
			p.mapping(v, key, []field{
				{"name", func(p *parser, key string, v *yaml.Node) { p.str(key, v, &c.Job.Name) }},
				{"token_file", func(p *parser, key string, v *yaml.Node) { p.str(key, v, &c.Job.TokenFile) }},
				{"token_env", func(p *parser, key string, v *yaml.Node) { p.str(key, v, &c.Job.TokenEnv) }},
				{"local_size", func(p *parser, key string, v *yaml.Node) { p.integer(key, v, &c.Job.LocalSize) }},
			})
		}},
		{"peers", func(p *parser, key string, v *yaml.Node) { p.peers(key, v, &c.Peers) }},
		{"rank", func(p *parser, key string, v *yaml.Node) { p.rank(key, v, &c.Rank) }},
		{"listen", func(p *parser, key string, v *yaml.Node) { p.str(key, v, &c.Listen) }},
		{"socket", func(p *parser, key string, v *yaml.Node) {
			p.mapping(v, key, []field{
				{"path", func(p *parser, key string, v *yaml.Node) { p.str(key, v, &c.Socket.Path) }},
				{"mode", func(p *parser, key string, v *yaml.Node) { p.mode(key, v, &c.Socket.Mode) }},
				{"allowed_uids", func(p *parser, key string, v *yaml.Node) { p.ids(key, v, "uid", &c.Socket.AllowedUIDs) }},
				{"allowed_gids", func(p *parser, key string, v *yaml.Node) { p.ids(key, v, "gid", &c.Socket.AllowedGIDs) }},
			})
		}},
		{"timeouts", func(p *parser, key string, v *yaml.Node) {
			t := &c.Timeouts
			p.mapping(v, key, []field{
				{"connect", durationField(&t.Connect)},
				{"collective", durationField(&t.Collective)},
				{"first_call", durationField(&t.FirstCall)},
				{"stall_warning", durationField(&t.StallWarning)},
				{"hello", durationField(&t.Hello)},
				{"heartbeat", durationField(&t.Heartbeat)},
				{"heartbeat_timeout", durationField(&t.HeartbeatTimeout)},
			})
		}},
		{"ring", func(p *parser, key string, v *yaml.Node) {
			p.mapping(v, key, []field{
				{"streams", func(p *parser, key string, v *yaml.Node) { p.integer(key, v, &c.Ring.Streams) }},
				{"segment_bytes", sizeField(&c.Ring.SegmentBytes)},
				{"small_bytes", sizeField(&c.Ring.SmallBytes)},
				{"spin", durationField(&c.Ring.Spin)},
			})
		}},
		{"fusion", func(p *parser, key string, v *yaml.Node) {
			p.mapping(v, key, []field{
				{"threshold_bytes", sizeField(&c.Fusion.ThresholdBytes)},
				{"cycle", durationField(&c.Fusion.Cycle)},
			})
		}},
		{"limits", func(p *parser, key string, v *yaml.Node) {
			p.mapping(v, key, []field{
				{"inline_bytes", sizeField(&c.Limits.InlineBytes)},
				{"shm_quota_bytes", sizeField(&c.Limits.ShmQuotaBytes)},
				{"max_segments", func(p *parser, key string, v *yaml.Node) { p.integer(key, v, &c.Limits.MaxSegments) }},
				{"max_in_flight", func(p *parser, key string, v *yaml.Node) { p.integer(key, v, &c.Limits.MaxInFlight) }},
				{"max_clients", func(p *parser, key string, v *yaml.Node) { p.integer(key, v, &c.Limits.MaxClients) }},
			})
		}},
		{"log", func(p *parser, key string, v *yaml.Node) {
			p.mapping(v, key, []field{
				{"level", func(p *parser, key string, v *yaml.Node) { p.str(key, v, &c.Log.Level) }},
				{"format", func(p *parser, key string, v *yaml.Node) { p.str(key, v, &c.Log.Format) }},
			})
		}},
	}
}

func durationField(dst *time.Duration) func(*parser, string, *yaml.Node) {
	return func(p *parser, key string, v *yaml.Node) { p.duration(key, v, dst) }
}

func sizeField(dst *int64) func(*parser, string, *yaml.Node) {
	return func(p *parser, key string, v *yaml.Node) { p.size(key, v, dst) }
}

func join(path, name string) string {
	if !isWord(name) {
		name = fmt.Sprintf("%q", name)
	}
	if path == "" {
		return name
	}
	return path + "." + name
}

func isWord(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// mapping walks a section. A missing or empty section keeps its defaults.
func (p *parser) mapping(n *yaml.Node, path string, fields []field) {
	n = deref(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		p.failf(n.Line, path, "must be a mapping of keys (%s), not %s", names(fields), describe(n))
		return
	}
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.failf(k.Line, path, "a key must be a plain word, not %s", describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			p.failf(k.Line, path, "merge keys (<<) are not supported; write the keys out")
			continue
		}
		key := join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			p.failf(k.Line, key, "repeated; it was first set at line %d", first)
			continue
		}
		seen[k.Value] = k.Line
		f := lookup(fields, k.Value)
		if f == nil {
			where := "the top level"
			if path != "" {
				where = path
			}
			hint := ""
			if s := suggest(fields, k.Value); s != "" {
				hint = fmt.Sprintf("did you mean %q? ", s)
			}
			p.fail(k.Line, key, fmt.Errorf("%w (%s%s takes: %s)", ErrUnknownKey, hint, where, names(fields)))
			continue
		}
		p.o.lines[key] = k.Line
		f.set(p, key, v)
	}
}

func lookup(fields []field, name string) *field {
	for i := range fields {
		if fields[i].name == name {
			return &fields[i]
		}
	}
	return nil
}

func names(fields []field) string {
	s := make([]string, len(fields))
	for i, f := range fields {
		s[i] = f.name
	}
	return strings.Join(s, ", ")
}

// suggest finds a known key within two edits of a misspelled one.
func suggest(fields []field, name string) string {
	if len(name) > 64 {
		return ""
	}
	best, bestD := "", 3
	for _, f := range fields {
		if d := editDistance(strings.ToLower(name), f.name); d < bestD {
			best, bestD = f.name, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// scalar returns v if it is a scalar with a value, else records why not.
func (p *parser) scalar(key string, v *yaml.Node, want string) (*yaml.Node, bool) {
	v = deref(v)
	if v.Kind != yaml.ScalarNode {
		p.failf(v.Line, key, "must be %s, not %s", want, describe(v))
		return nil, false
	}
	if isNull(v) {
		p.failf(v.Line, key, "has no value; give %s, or remove the key to use the default", want)
		return nil, false
	}
	return v, true
}

func (p *parser) str(key string, v *yaml.Node, dst *string) {
	v, ok := p.scalar(key, v, "a string")
	if !ok {
		return
	}
	if v.ShortTag() != "!!str" {
		// YAML reads yes, no, on, 010 and 1e3 as other types; quoting says
		// the string was meant.
		p.failf(v.Line, key, "must be a string, not %s (quote it if a string was meant)", describe(v))
		return
	}
	*dst = v.Value
}

func (p *parser) integer(key string, v *yaml.Node, dst *int) {
	v, ok := p.scalar(key, v, "an integer")
	if !ok {
		return
	}
	var n int64
	if v.ShortTag() != "!!int" || v.Decode(&n) != nil {
		p.failf(v.Line, key, "must be an integer, not %s", describe(v))
		return
	}
	if leadingZero(v.Value) {
		p.failf(v.Line, key, leadingZeroMsg, v.Value)
		return
	}
	if n < math.MinInt32 || n > math.MaxInt32 {
		p.failf(v.Line, key, "%s is out of range", v.Value)
		return
	}
	*dst = int(n)
}

func (p *parser) size(key string, v *yaml.Node, dst *int64) {
	v, ok := p.scalar(key, v, `a size (e.g. 4096 or "64KiB")`)
	if !ok {
		return
	}
	switch v.ShortTag() {
	case "!!int":
		var n int64
		if v.Decode(&n) != nil {
			p.failf(v.Line, key, "%s is not a size", v.Value)
			return
		}
		if leadingZero(v.Value) {
			p.failf(v.Line, key, leadingZeroMsg, v.Value)
			return
		}
		if n < 0 {
			p.failf(v.Line, key, "%s is negative; a size counts bytes", v.Value)
			return
		}
		*dst = n
	case "!!str":
		n, err := ParseSize(v.Value)
		if err != nil {
			p.fail(v.Line, key, err)
			return
		}
		*dst = n
	default:
		p.failf(v.Line, key, "must be a whole number of bytes or a string like \"64KiB\", not %s", describe(v))
	}
}

func (p *parser) duration(key string, v *yaml.Node, dst *time.Duration) {
	v, ok := p.scalar(key, v, `a duration (e.g. "10s")`)
	if !ok {
		return
	}
	if v.ShortTag() != "!!str" {
		p.failf(v.Line, key, "%s is not a duration: give a unit, e.g. \"%ss\"", describe(v), v.Value)
		return
	}
	d, err := time.ParseDuration(v.Value)
	if err != nil {
		p.failf(v.Line, key, "%q is not a duration (e.g. \"500ms\", \"10s\", \"5m\", \"1h\")", v.Value)
		return
	}
	*dst = d
}

func (p *parser) mode(key string, v *yaml.Node, dst *os.FileMode) {
	v, ok := p.scalar(key, v, `an octal mode (e.g. "0660")`)
	if !ok {
		return
	}
	if t := v.ShortTag(); t != "!!int" && t != "!!str" {
		p.failf(v.Line, key, "must be an octal mode like \"0660\", not %s", describe(v))
		return
	}
	m, err := parseMode(v.Value)
	if err != nil {
		p.fail(v.Line, key, err)
		return
	}
	*dst = os.FileMode(m)
}

func (p *parser) rank(key string, v *yaml.Node, dst *RankSpec) {
	v, ok := p.scalar(key, v, `an integer or "auto"`)
	if !ok {
		return
	}
	var n int64
	switch {
	case v.ShortTag() == "!!str" && v.Value == "auto":
		*dst = AutoRank()
	case v.ShortTag() == "!!int" && leadingZero(v.Value):
		p.failf(v.Line, key, leadingZeroMsg, v.Value)
	case v.ShortTag() == "!!int" && v.Decode(&n) == nil && n >= math.MinInt32 && n <= math.MaxInt32:
		*dst = FixedRank(int(n))
	default:
		p.failf(v.Line, key, "%s is neither an integer nor \"auto\"", describe(v))
	}
}

func (p *parser) peers(key string, v *yaml.Node, dst *[]string) {
	v = deref(v)
	if v.Kind != yaml.SequenceNode {
		p.failf(v.Line, key, "must be a list of host:port addresses, not %s", describe(v))
		return
	}
	if len(v.Content) > MaxPeers {
		p.failf(v.Line, key, "has %d entries; at most %d are supported", len(v.Content), MaxPeers)
		return
	}
	out := make([]string, 0, len(v.Content))
	for i, item := range v.Content {
		ik := fmt.Sprintf("%s[%d]", key, i)
		p.o.lines[ik] = deref(item).Line
		var s string
		p.str(ik, item, &s)
		out = append(out, s)
	}
	*dst = out
}

func (p *parser) ids(key string, v *yaml.Node, what string, dst *[]uint32) {
	v = deref(v)
	if isNull(v) {
		return
	}
	if v.Kind != yaml.SequenceNode {
		p.failf(v.Line, key, "must be a list of numeric %ss, not %s", what, describe(v))
		return
	}
	out := make([]uint32, 0, len(v.Content))
	for i, item := range v.Content {
		ik := fmt.Sprintf("%s[%d]", key, i)
		item = deref(item)
		p.o.lines[ik] = item.Line
		var n uint64
		if item.Kind != yaml.ScalarNode || item.ShortTag() != "!!int" || item.Decode(&n) != nil || n >= math.MaxUint32 || leadingZero(item.Value) {
			p.failf(item.Line, ik, "%s is not a numeric %s (0 to %d)", describe(item), what, uint32(math.MaxUint32-1))
			continue
		}
		out = append(out, uint32(n))
	}
	*dst = out
}

const leadingZeroMsg = "%s has a leading zero, which YAML reads as octal; write the number without it (or 0o for octal)"

// leadingZero spots 010, which YAML 1.1 reads as 8: nobody writing a count
// or an id means that.
func leadingZero(s string) bool {
	s = strings.TrimLeft(s, "+-")
	return len(s) > 1 && s[0] == '0' && s[1] >= '0' && s[1] <= '9'
}
