package daemon

import (
	"net"
)

func closeLinks(sets ...[]net.Conn) {
	for _, set := range sets {
		for _, c := range set {
			if c != nil {
				c.Close()
			}
		}
	}
}
