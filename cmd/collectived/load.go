package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/collectived/collectived/config"
	"github.com/collectived/collectived/daemon"
)

var (
	configFlag = &cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "the job's YAML `FILE`", Required: true, EnvVars: []string{"COLLECTIVED_CONFIG"}}
	rankFlag   = &cli.IntFlag{Name: "rank", Usage: "this node's rank `N` (overrides the file's rank)", Value: -1}
	socketFlag = &cli.StringFlag{Name: "socket", Usage: "Unix socket `PATH` for trainers (overrides socket.path)"}
	listenFlag = &cli.StringFlag{Name: "listen", Usage: "ring listen `ADDR` (overrides listen)"}
)

// loadConfig reads the file named by --config and applies the flags that
// override it, so that one file can serve every node.
func loadConfig(c *cli.Context) (*config.Config, int, error) {
	cfg, err := config.Load(c.String(configFlag.Name))
	if err != nil {
		return nil, 0, err
	}
	if c.IsSet(socketFlag.Name) {
		cfg.Socket.Path = c.String(socketFlag.Name)
		cfg.SetByFlag("socket.path", "--"+socketFlag.Name)
	}
	if c.IsSet(listenFlag.Name) {
		cfg.Listen = c.String(listenFlag.Name)
		cfg.SetByFlag("listen", "--"+listenFlag.Name)
	}
	if err := cfg.Validate(); err != nil {
		return nil, 0, err
	}
	rank, err := cfg.ResolveRank(c.Int(rankFlag.Name))
	if err != nil {
		return nil, 0, err
	}
	return cfg, rank, nil
}

// daemonConfig turns a validated file config into the core's config.
func daemonConfig(cfg *config.Config, rank int, log *slog.Logger) (daemon.Config, error) {
	dc := daemon.DefaultConfig()
	token, err := cfg.Token()
	if err != nil {
		return dc, err
	}
	dc.Job = cfg.Job.Name
	dc.Token = token
	dc.Peers = cfg.Peers
	dc.Rank = rank
	dc.Listen = cfg.Listen
	dc.LocalSize = cfg.Job.LocalSize
	dc.Digest = cfg.ShapeDigest()
	dc.SocketPath = cfg.Socket.Path
	dc.SocketMode = cfg.Socket.Mode
	dc.AllowedUIDs = cfg.Socket.AllowedUIDs
	dc.AllowedGIDs = cfg.Socket.AllowedGIDs
	dc.Streams = cfg.Ring.Streams
	dc.SegmentBytes = int(cfg.Ring.SegmentBytes)
	dc.SmallBytes = int(cfg.Ring.SmallBytes)
	dc.Spin = cfg.Ring.Spin
	dc.ConnectTimeout = cfg.Timeouts.Connect
	dc.CollectiveTimeout = cfg.Timeouts.Collective
	dc.FirstCallTimeout = cfg.Timeouts.FirstCall
	dc.StallWarning = cfg.Timeouts.StallWarning
	dc.HelloTimeout = cfg.Timeouts.Hello
	dc.HeartbeatInterval = cfg.Timeouts.Heartbeat
	dc.HeartbeatTimeout = cfg.Timeouts.HeartbeatTimeout
	dc.InlineBytes = int(cfg.Limits.InlineBytes)
	dc.ShmQuota = cfg.Limits.ShmQuotaBytes
	dc.MaxSegments = cfg.Limits.MaxSegments
	dc.MaxInFlight = cfg.Limits.MaxInFlight
	dc.FusionThreshold = int(cfg.Fusion.ThresholdBytes)
	dc.FusionCycle = cfg.Fusion.Cycle
	dc.MaxClients = cfg.Limits.MaxClients
	dc.Logger = log
	return dc, nil
}

// newLogger builds the daemon's slog logger from the log section.
func newLogger(l config.Log) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.SlogLevel()}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

func exitf(format string, args ...any) error {
	return cli.Exit(fmt.Sprintf(format, args...), 1)
}
