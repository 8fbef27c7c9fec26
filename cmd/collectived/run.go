package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/collectived/collectived/daemon"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "run the daemon in the foreground (systemd Type=notify)",
		Flags: []cli.Flag{configFlag, rankFlag, socketFlag, listenFlag},
		Action: func(c *cli.Context) error {
			cfg, rank, err := loadConfig(c)
			if err != nil {
				return err
			}
			// Under the unit, whose IP allow-list comes from the peers
			// (ipallow.go): it must be this config's.
			if v, ok := os.LookupEnv(allowedPeersEnv); ok {
				if err := checkAllowedPeers(c.String(configFlag.Name), cfg.Peers, v); err != nil {
					return err
				}
			}
			// The daemon adds the job and node to every line it logs;
			// this command's own lines add them here, once.
			base := newLogger(cfg.Log)
			log := base.With("job", cfg.Job.Name, "node", rank)
			dc, err := daemonConfig(cfg, rank, base)
			if err != nil {
				return err
			}
			n := newNotifier(log)
			dc.OnState = n.status
			d, err := daemon.New(dc)
			if err != nil {
				return err
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
			d.Start()
			n.ready()
			stopWatchdog := n.watchdog(d)
			sig := <-sigs
			log.Info("stopping", "signal", sig.String())
			n.stopping()
			stopWatchdog()
			return d.Close()
		},
	}
}
