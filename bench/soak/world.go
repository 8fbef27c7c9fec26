package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

const (
	jobName  = "soak"
	tokenEnv = "COLLECTIVED_SOAK_TOKEN"
	// stopGrace bounds how long a daemon may take to leave after SIGTERM
	// before it is killed.
	stopGrace = 10 * time.Second
	// openWait bounds how long a daemon may take to open its socket.
	openWait = 30 * time.Second
)

// buildDaemon builds ./cmd/collectived of the module this program lives
// in, wherever it is run from.
func buildDaemon(dir string) (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not inside the collectived module (run from the repository, or give --bin)")
	}
	bin := filepath.Join(dir, "collectived")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/collectived")
	cmd.Dir = filepath.Dir(mod)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/collectived in %s: %w\n%s", cmd.Dir, err, stderr.String())
	}
	return bin, nil
}
