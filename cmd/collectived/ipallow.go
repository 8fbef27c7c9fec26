package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/collectived/collectived/config"
)

// The systemd unit denies every IP address (IPAddressDeny=any); the
// addresses the daemon may talk to come from the config's peers, through
// a drop-in that `collectived ipallow` writes:
//
//	collectived ipallow --config /etc/collectived/config.yaml \
//	    > /etc/systemd/system/collectived.service.d/peers.conf
//	systemctl daemon-reload
//
// The drop-in also sets allowedPeersEnv to a digest of the peer list it was
// made from, and the unit sets it to "none" until one is installed: the
// daemon refuses to start when the two disagree with its config
// (checkAllowedPeers), so a peer list edited without a new drop-in is an
// error that names the fix, not a ring that cannot form.
const allowedPeersEnv = "COLLECTIVED_ALLOWED_PEERS"

// dropInPath is where the README installs the drop-in.
const dropInPath = "/etc/systemd/system/collectived.service.d/peers.conf"

func ipallowCommand() *cli.Command {
	return &cli.Command{
		Name:  "ipallow",
		Usage: "print the systemd drop-in that lets the unit reach the config's peers (IPAddressAllow=)",
		Description: "The unit denies every IP address; install what this prints as " + dropInPath +
			" and run systemctl daemon-reload, again whenever the peers change. Host names are resolved now.",
		Flags: []cli.Flag{configFlag,
			&cli.StringFlag{Name: "resolv-conf", Value: "/etc/resolv.conf", Usage: "where the name servers are listed (allowed too when a peer is a host name)"}},
		Action: func(c *cli.Context) error {
			path := c.String(configFlag.Name)
			cfg, err := config.Load(path)
			if err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			out, err := ipAllowDropIn(path, cfg.Peers, lookupHost, func() ([]netip.Addr, error) {
				return nameservers(c.String("resolv-conf"))
			})
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(c.App.Writer, out)
			return err
		},
	}
}

// ipAllowDropIn renders the drop-in for peers: an IPAddressAllow= line per
// address, the name servers too when a peer is a host name (the daemon
// resolves names itself), and allowedPeersEnv.
func ipAllowDropIn(cfgPath string, peers []string, lookup func(string) ([]netip.Addr, error),
	servers func() ([]netip.Addr, error)) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# Made by `collectived ipallow --config %s` from its peers: install as\n", cfgPath)
	fmt.Fprintf(&b, "# %s and run `systemctl daemon-reload`;\n", dropInPath)
	b.WriteString("# make it again whenever the peers change (the daemon refuses to start until then).\n")
	b.WriteString("# The unit denies every other IP address (IPAddressDeny=any).\n[Service]\n")
	seen := map[netip.Addr]bool{}
	allow := func(a netip.Addr) {
		a = a.Unmap().WithZone("")
		if !seen[a] {
			seen[a] = true
			fmt.Fprintf(&b, "IPAddressAllow=%s\n", a)
		}
	}
	names := false
	for _, p := range peers {
		host, _, err := net.SplitHostPort(p)
		if err != nil {
			return "", fmt.Errorf("peer %q: %w", p, err)
		}
		if a, err := netip.ParseAddr(host); err == nil {
			allow(a)
			continue
		}
		addrs, err := lookup(host)
		if err != nil || len(addrs) == 0 {
			return "", fmt.Errorf("peer %q: cannot resolve %s (%v): the allow-list needs its addresses; list the peer by IP address, or resolve it first", p, host, err)
		}
		sort.Slice(addrs, func(i, j int) bool { return addrs[i].Less(addrs[j]) })
		strs := make([]string, len(addrs))
		for i, a := range addrs {
			strs[i] = a.String()
		}
		fmt.Fprintf(&b, "# %s resolves to %s now; if that changes, make this file again\n", host, strings.Join(strs, " "))
		for _, a := range addrs {
			allow(a)
		}
		names = true
	}
	if names {
		ns, err := servers()
		if err != nil {
			return "", fmt.Errorf("some peers are host names, which the daemon resolves: %w", err)
		}
		if len(ns) > 0 {
			b.WriteString("# the name servers: some peers are host names, and the daemon resolves them\n")
		}
		for _, a := range ns {
			allow(a)
		}
	}
	fmt.Fprintf(&b, "Environment=%s=%s\n", allowedPeersEnv, peersDigest(peers))
	return b.String(), nil
}

func lookupHost(host string) ([]netip.Addr, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// nameservers lists the nameserver lines of a resolv.conf.
func nameservers(path string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "nameserver" {
			if a, err := netip.ParseAddr(fields[1]); err == nil {
				out = append(out, a)
			}
		}
	}
	return out, sc.Err()
}

// peersDigest names a peer list: the first 16 bytes of SHA-256 over the
// entries, one per line, in hex.
func peersDigest(peers []string) string {
	h := sha256.New()
	for _, p := range peers {
		h.Write([]byte(p + "\n"))
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// checkAllowedPeers is run's check of the unit's allow-list against the
// config (env: allowedPeersEnv's value, set by the unit and its drop-in).
// A world of one needs no IP address.
func checkAllowedPeers(cfgPath string, peers []string, env string) error {
	fix := fmt.Sprintf("make it from this config: collectived ipallow --config %s > %s; systemctl daemon-reload", cfgPath, dropInPath)
	switch {
	case len(peers) == 1:
		return nil
	case env == "none":
		return fmt.Errorf("the unit denies every IP address (IPAddressDeny=any) and no allow-list of the peers is installed: %s", fix)
	case env != peersDigest(peers):
		return fmt.Errorf("the unit's allow-list of IP addresses was made from another peer list than %s's (%s %s, the config's %s): %s",
			cfgPath, allowedPeersEnv, env, peersDigest(peers), fix)
	}
	return nil
}
