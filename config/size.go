package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var sizeUnits = map[string]int64{
	"":    1,
	"b":   1,
	"kib": KiB,
	"mib": MiB,
	"gib": GiB,
	"tib": TiB,
	"kb":  1000,
	"mb":  1000 * 1000,
	"gb":  1000 * 1000 * 1000,
	"tb":  1000 * 1000 * 1000 * 1000,
}

// ParseSize reads a byte count: "4096", "64KiB", "1 MiB", "4GiB" (binary
// units) or "10MB" (decimal units). A bare "K", "M" or "G" is refused as
// ambiguous.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("%q is not a size (e.g. 4096, \"64KiB\", \"1MiB\", \"4GiB\")", s)
	}
	unit := strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("%q is not a size: unknown unit %q (use B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB)", s, t[i:])
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * mult, nil
}

// FormatSize writes n in the largest binary unit that divides it exactly,
// so that FormatSize(64<<10) is "64KiB" and ParseSize reads it back.
func FormatSize(n int64) string {
	if n != 0 {
		for _, u := range []struct {
			name string
			size int64
		}{{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}} {
			if n%u.size == 0 {
				return strconv.FormatInt(n/u.size, 10) + u.name
			}
		}
	}
	return strconv.FormatInt(n, 10)
}

// parseMode reads permission bits written in octal: "0660", "660" or
// "0o660". The text is always octal, even when YAML would read it as a
// decimal integer, because that is how every Unix tool writes modes.
func parseMode(s string) (uint32, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O")
	if t == "" || len(t) > 6 {
		return 0, fmt.Errorf("%q is not an octal mode (e.g. \"0660\")", s)
	}
	for _, r := range t {
		if r < '0' || r > '7' {
			return 0, fmt.Errorf("%q is not an octal mode (e.g. \"0660\")", s)
		}
	}
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not an octal mode (e.g. \"0660\")", s)
	}
	return uint32(v), nil
}
