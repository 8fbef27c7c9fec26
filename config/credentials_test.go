package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A token_file under ${CREDENTIALS_DIRECTORY} is read from the directory
// systemd names at start (LoadCredential=), and refused clearly without it.
func TestTokenFromSystemdCredentials(t *testing.T) {
	src := "job:\n  name: j\n  token_file: ${CREDENTIALS_DIRECTORY}/token\npeers:\n  - 127.0.0.1:7001\n"
	c, err := Parse([]byte(src), "svc.yaml")
	if err != nil {
		t.Fatalf("a token_file under ${CREDENTIALS_DIRECTORY} should validate: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("0123456789abcdef0123\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", dir)
	tok, err := c.Token()
	if err != nil || string(tok) != "0123456789abcdef0123" {
		t.Fatalf("Token() = %q, %v", tok, err)
	}
	t.Setenv("CREDENTIALS_DIRECTORY", "")
	_, err = c.Token()
	if !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "svc.yaml:3: job.token_file") || !strings.Contains(err.Error(), "not set") {
		t.Fatalf("without CREDENTIALS_DIRECTORY: %v", err)
	}
	if _, err := Parse([]byte(strings.Replace(src, "${CREDENTIALS_DIRECTORY}/token", "token", 1)), "svc.yaml"); err == nil || !strings.Contains(err.Error(), "not an absolute path") {
		t.Fatalf("a relative token_file should be refused: %v", err)
	}
}
