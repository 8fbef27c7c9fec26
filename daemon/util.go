package daemon

import (
	"net"
	"strings"
)

func hasTag(msg, tag string) bool { return strings.Contains(msg, tag) }

func closeLinks(sets ...[]net.Conn) {
	for _, set := range sets {
		for _, c := range set {
			if c != nil {
				c.Close()
			}
		}
	}
}
