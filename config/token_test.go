package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const secret = "s3cr3t-t0ken-0123456789abcdef"

func tokenFileConfig(t *testing.T, content string, mode os.FileMode) (*Config, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	// Chmod after writing: WriteFile's mode is filtered by the umask.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return mustParse(t, fmt.Sprintf("job:\n  name: demo\n  token_file: %s\npeers: [\"127.0.0.1:1\"]\n", path)), path
}

func TestTokenFile(t *testing.T) {
	for _, tc := range []struct {
		content string
		mode    os.FileMode
	}{
		{secret + "\n", 0o600},
		{secret + "\r\n", 0o400},
		{secret, 0o600},
		{secret + "\n\n", 0o700},
	} {
		c, path := tokenFileConfig(t, tc.content, tc.mode)
		tok, err := c.Token()
		if err != nil || string(tok) != secret {
			t.Errorf("Token from %q mode %04o = %q, %v", path, tc.mode, tok, err)
		}
	}
}

func TestTokenFileRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content string
		mode    os.FileMode
		is      error
		want    string // %s is the file's path
	}{
		{"world readable", secret, 0o644, ErrTokenInsecure, "config.yaml:3: job.token_file: token file is accessible to group or others: %s has mode 0644; run: chmod 600 %s"},
		{"group readable", secret, 0o640, ErrTokenInsecure, "%s has mode 0640; run: chmod 600 %s"},
		{"group writable", secret, 0o620, ErrTokenInsecure, "%s has mode 0620; run: chmod 600 %s"},
		{"other writable", secret, 0o602, ErrTokenInsecure, "%s has mode 0602; run: chmod 600 %s"},
		{"empty", "", 0o600, ErrTokenInvalid, "config.yaml:3: job.token_file: token unusable: %s is empty"},
		{"only newline", "\n", 0o600, ErrTokenInvalid, "%s is empty"},
		{"short", "abc123\n", 0o600, ErrTokenInvalid, "%s holds 6 bytes; a token needs at least 16"},
		{"too big", strings.Repeat("x", MaxTokenBytes+1), 0o600, ErrTokenInvalid, "%s is larger than 65536 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, path := tokenFileConfig(t, tc.content, tc.mode)
			tok, err := c.Token()
			want := strings.ReplaceAll(tc.want, "%s", path)
			if tok != nil || !errors.Is(err, tc.is) || !strings.Contains(err.Error(), want) {
				t.Errorf("Token = %q, %v\nwant error %v containing %q", tok, err, tc.is, want)
			}
			if tok := strings.TrimSpace(tc.content); err != nil && tok != "" && strings.Contains(err.Error(), tok) {
				t.Errorf("error reveals the token: %v", err)
			}
		})
	}
}

func TestTokenFileMissingOrNotAFile(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope")
	c := mustParse(t, fmt.Sprintf("job:\n  name: demo\n  token_file: %s\npeers: [\"127.0.0.1:1\"]\n", missing))
	_, err := c.Token()
	if !errors.Is(err, ErrTokenInvalid) || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "config.yaml:3: job.token_file: token unusable: open "+missing) {
		t.Errorf("Token(missing) = %v", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	c.Job.TokenFile = dir
	_, err = c.Token()
	if !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), dir+" is not a regular file") {
		t.Errorf("Token(dir) = %v", err)
	}
}

func TestTokenEnv(t *testing.T) {
	c := mustParse(t, "job:\n  name: demo\n  token_env: COLLECTIVED_TEST_TOKEN\npeers: [\"127.0.0.1:1\"]\n")
	t.Setenv("COLLECTIVED_TEST_TOKEN", secret+"\n")
	if tok, err := c.Token(); err != nil || string(tok) != secret {
		t.Errorf("Token = %q, %v", tok, err)
	}
	t.Setenv("COLLECTIVED_TEST_TOKEN", "short")
	if _, err := c.Token(); !errors.Is(err, ErrTokenInvalid) ||
		!strings.Contains(err.Error(), "config.yaml:3: job.token_env: token unusable: environment variable COLLECTIVED_TEST_TOKEN holds 5 bytes") {
		t.Errorf("Token(short) = %v", err)
	}
	t.Setenv("COLLECTIVED_TEST_TOKEN", "")
	if _, err := c.Token(); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "COLLECTIVED_TEST_TOKEN is empty") {
		t.Errorf("Token(empty) = %v", err)
	}
	os.Unsetenv("COLLECTIVED_TEST_TOKEN")
	if _, err := c.Token(); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "environment variable COLLECTIVED_TEST_TOKEN is not set") {
		t.Errorf("Token(unset) = %v", err)
	}
}

func TestTokenSourceRequired(t *testing.T) {
	c := Default()
	if _, err := c.Token(); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "job: token unusable: neither token_file nor token_env is set") {
		t.Errorf("Token() = %v", err)
	}
	c.Job.TokenFile, c.Job.TokenEnv = "/x", "X"
	if _, err := c.Token(); !errors.Is(err, ErrTokenInvalid) || !strings.Contains(err.Error(), "both") {
		t.Errorf("Token() = %v", err)
	}
}
