package main

import (
	"fmt"
	"runtime"

	"github.com/urfave/cli/v2"

	"github.com/collectived/collectived/ipc"
)

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version and the protocol it speaks",
		Action: func(c *cli.Context) error {
			fmt.Fprintf(c.App.Writer, "collectived %s (client protocol %d to %d, %s, %s/%s)\n",
				version, ipc.MinVersion, ipc.Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return nil
		},
	}
}
