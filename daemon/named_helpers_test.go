package daemon

// Test-only views of the matcher's named calls, for the model test.

// inFlight reports whether rank l has a named call of name waiting (the
// daemon's sessions refuse a second one: ipc).
func (m *matcher[C]) inFlight(l int, name string) bool {
	for _, q := range m.slots[l].queue {
		if q.name == name {
			return true
		}
	}
	return false
}

// readyNames appends the names readyCalls returns.
func (m *matcher[C]) readyNames(dst []string) []string {
	for _, c := range m.readyCalls(nil) {
		dst = append(dst, c.name)
	}
	return dst
}
