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
			log := newLogger(cfg.Log).With("job", cfg.Job.Name)
			dc, err := daemonConfig(cfg, rank, log)
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
