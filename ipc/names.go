package ipc

import "unicode/utf8"

// maxNames bounds a Names cache; past it the cache starts over, so a client
// sending ever-new names costs at most this many strings.
const maxNames = 1024

// Names interns call names so that decoding a CALL whose name was seen
// before does not allocate. The zero value is ready; it is not safe for
// concurrent use (one per reader).
type Names struct{ m map[string]string }

// intern returns prev if it equals b, else the cached string for b, else a
// new string (which is cached).
func (n *Names) intern(prev string, b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if prev == string(b) {
		return prev
	}
	if n == nil {
		return string(b)
	}
	if s, ok := n.m[string(b)]; ok {
		return s
	}
	if n.m == nil || len(n.m) >= maxNames {
		n.m = make(map[string]string)
	}
	s := string(b)
	n.m[s] = s
	return s
}

func validUTF8(b []byte) bool { return utf8.Valid(b) }
