package main

import (
	"fmt"

	"github.com/urfave/cli/v2"
)

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "validate a config and print the resolved world",
		Flags: []cli.Flag{configFlag, rankFlag, socketFlag, listenFlag},
		Action: func(c *cli.Context) error {
			cfg, rank, err := loadConfig(c)
			if err != nil {
				return err
			}
			if _, err := cfg.Token(); err != nil {
				return err
			}
			w := c.App.Writer
			L := cfg.Job.LocalSize
			fmt.Fprintf(w, "%s: ok\n", c.String(configFlag.Name))
			fmt.Fprintf(w, "job %q: %d nodes x %d trainers = world of %d\n", cfg.Job.Name, len(cfg.Peers), L, len(cfg.Peers)*L)
			fmt.Fprintf(w, "shape digest %x\n", cfg.ShapeDigest())
			for i, p := range cfg.Peers {
				mark := " "
				if i == rank {
					mark = "*"
				}
				fmt.Fprintf(w, "%s node %d  %-22s world ranks %d-%d\n", mark, i, p, i*L, i*L+L-1)
			}
			fmt.Fprintf(w, "this node: rank %d, ring listen %s, socket %s (mode %04o)\n",
				rank, cfg.ListenAddress(rank), cfg.Socket.Path, cfg.Socket.Mode)
			return nil
		},
	}
}
