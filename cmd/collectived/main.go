// Command collectived is the per-node sidecar daemon of collectived and its
// tools: run the daemon, check a config, ask a running daemon for its
// status, benchmark a local world.
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	if err := newApp().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "collectived:", err)
		os.Exit(1)
	}
}

func newApp() *cli.App {
	return &cli.App{
		Name:    "collectived",
		Usage:   "collective operations for training processes, one daemon per node",
		Version: version,
		Commands: []*cli.Command{
			runCommand(),
			checkCommand(),
			statusCommand(),
			benchCommand(),
			versionCommand(),
			benchTrainerCommand(),
			benchRingCommand(),
		},
		HideVersion: true,
	}
}
