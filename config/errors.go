package config

import (
	"errors"
	"sort"
	"strconv"
	"strings"
)

// Sentinels for errors.Is. Every *Error also matches ErrInvalid.
var (
	ErrInvalid       = errors.New("invalid config")
	ErrUnknownKey    = errors.New("unknown key")
	ErrNoLocalPeer   = errors.New("no peer address is on a local interface")
	ErrAmbiguousRank = errors.New("more than one peer address is on a local interface")
	ErrTokenInsecure = errors.New("token file is accessible to group or others")
	ErrTokenInvalid  = errors.New("token unusable")
)

// Error is one problem with a config, placed at its key and line:
//
//	config.yaml:14: timeouts.collective: "5x" is not a duration
//
// Line is 0 for configs built in code (or for problems of the whole file
// that have no line); Key is "" for YAML syntax errors.
type Error struct {
	Source string
	Line   int
	Key    string
	Err    error
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Is makes every config error match ErrInvalid.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// ErrorList is every problem found in one pass, in line order. Parse and
// Validate return it (never empty) so that `collectived check` can show
// all of them at once.
type ErrorList []*Error

func (l ErrorList) Error() string {
	s := make([]string, len(l))
	for i, e := range l {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Unwrap lets errors.Is and errors.As see each error.
func (l ErrorList) Unwrap() []error {
	errs := make([]error, len(l))
	for i, e := range l {
		errs[i] = e
	}
	return errs
}

func (l ErrorList) err() error {
	if len(l) == 0 {
		return nil
	}
	sort.SliceStable(l, func(i, j int) bool { return l[i].Line < l[j].Line })
	return l
}

// origin is where a parsed config came from: the line of every key it
// had, and the keys whose values did not parse (Validate does not repeat
// those).
type origin struct {
	source string
	lines  map[string]int
	bad    map[string]bool
	flags  map[string]string // key -> the command-line flag that set it after parsing
}

// line is the line of key, or of its nearest ancestor that was in the
// file (a missing key is reported at its section).
func (o *origin) line(key string) int {
	if o == nil {
		return 0
	}
	for {
		if l, ok := o.lines[key]; ok {
			return l
		}
		if key == "" {
			return 0
		}
		i := strings.LastIndexAny(key, ".[")
		if i < 0 {
			key = ""
		} else {
			key = key[:i]
		}
	}
}

// errAt builds an Error for key placed with c's origin.
func (c *Config) errAt(key string, err error) *Error {
	if c.pos != nil {
		if f, ok := c.pos.flags[key]; ok {
			return &Error{Source: f, Key: key, Err: err}
		}
	}
	return &Error{Source: c.Source(), Line: c.pos.line(key), Key: key, Err: err}
}

// isBad reports whether key, a section holding it, or a key inside it
// failed to parse.
func (o *origin) isBad(key string) bool {
	if o == nil {
		return false
	}
	for b := range o.bad {
		if b == key || within(key, b) || within(b, key) {
			return true
		}
	}
	return false
}

// within reports whether key lies inside section ("" holds everything).
func within(key, section string) bool {
	if section == "" {
		return true
	}
	return len(key) > len(section) && strings.HasPrefix(key, section) &&
		(key[len(section)] == '.' || key[len(section)] == '[')
}
