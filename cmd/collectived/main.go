// Command collectived is the per-node sidecar daemon of collectived and its
// tools: run the daemon, check a config, ask a running daemon for its
// status, benchmark a local world, run a development world (up).
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	if err := newApp().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// errorLine is how a failed command reports err: prefixed with the
// program's name once, as the Go client's errors (status) already are.
func errorLine(err error) string {
	msg := err.Error()
	if strings.HasPrefix(msg, "collectived:") {
		return msg
	}
	return "collectived: " + msg
}

func newApp() *cli.App {
	return &cli.App{
		Name:    "collectived",
		Usage:   "collective operations for training processes, one daemon per node",
		Version: version,
		Commands: []*cli.Command{
			runCommand(),
			checkCommand(),
			ipallowCommand(),
			statusCommand(),
			benchCommand(),
			upCommand(),
			versionCommand(),
			benchTrainerCommand(),
			benchRingCommand(),
		},
		HideVersion: true,
	}
}
