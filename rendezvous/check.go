package rendezvous

import (
	"fmt"
	"net"
)

// checkHello compares a peer's hello with our own configuration. Both
// sides run it on the other's hello, so either end names a mismatch with
// both values. link is "next" or "prev": the role the peer should play.
func checkHello(cfg *Config, h *hello, link string, wantRank int) error {
	if h.ByteOrder != nativeBOM {
		return byteOrderError(h.ByteOrder)
	}
	if h.Job != cfg.Job {
		return fmt.Errorf("%w: peer %q, ours %q", ErrJob, sanitize([]byte(h.Job)), cfg.Job)
	}
	if int(h.World) != len(cfg.Peers) {
		return fmt.Errorf("%w: peer %d, ours %d", ErrWorldSize, h.World, len(cfg.Peers))
	}
	if h.Digest != cfg.Digest {
		return fmt.Errorf("%w: peer %s, ours %s", ErrDigest, shortHex(h.Digest), shortHex(cfg.Digest))
	}
	if int(h.Streams) != cfg.Streams {
		return fmt.Errorf("%w: peer %d, ours %d", ErrStreams, h.Streams, cfg.Streams)
	}
	if int(h.Rank) != wantRank {
		return fmt.Errorf("%w: peer says rank %d, our %s is rank %d", ErrUnexpectedRank, h.Rank, link, wantRank)
	}
	if int(h.Stream) >= cfg.Streams {
		return fmt.Errorf("%w: stream %d from rank %d, streams per link %d", ErrUnexpectedRank, h.Stream, h.Rank, cfg.Streams)
	}
	return nil
}

func byteOrderError(b [4]byte) error {
	name := func(b [4]byte) string {
		switch b {
		case [4]byte{1, 2, 3, 4}:
			return "big-endian"
		case [4]byte{4, 3, 2, 1}:
			return "little-endian"
		}
		return fmt.Sprintf("unknown marker % x", b[:])
	}
	return fmt.Errorf("%w: peer %s, ours %s", ErrByteOrder, name(b), name(nativeBOM))
}

// ipIn reports whether ip is one of ips, treating IPv4 and its IPv6-mapped
// form as the same address.
func ipIn(ip net.IP, ips []net.IP) bool {
	for _, x := range ips {
		if x.Equal(ip) {
			return true
		}
	}
	return false
}
