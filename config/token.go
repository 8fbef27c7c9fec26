package config

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Token reads the job token from Job.TokenFile or from the environment
// variable Job.TokenEnv. Trailing newlines are dropped (echo and editors
// add them). A token file must be a regular file that neither group nor
// others may read or write: a token others can read lets them join or
// disrupt the job. The token is never put in an error or a log.
func (c *Config) Token() ([]byte, error) {
	j := &c.Job
	switch {
	case j.TokenFile != "" && j.TokenEnv != "":
		return nil, c.errAt("job", fmt.Errorf("%w: both token_file and token_env are set", ErrTokenInvalid))
	case j.TokenFile != "":
		return c.tokenFile(j.TokenFile)
	case j.TokenEnv != "":
		v, ok := os.LookupEnv(j.TokenEnv)
		if !ok {
			return nil, c.errAt("job.token_env", fmt.Errorf("%w: environment variable %s is not set", ErrTokenInvalid, j.TokenEnv))
		}
		if len(v) > MaxTokenBytes {
			return nil, c.errAt("job.token_env", fmt.Errorf("%w: environment variable %s holds more than %d bytes", ErrTokenInvalid, j.TokenEnv, MaxTokenBytes))
		}
		return c.checkToken("job.token_env", "environment variable "+j.TokenEnv, []byte(v))
	}
	return nil, c.errAt("job", fmt.Errorf("%w: neither token_file nor token_env is set", ErrTokenInvalid))
}

// CredentialsPrefix starts a token_file inside the directory where systemd
// puts the credentials of LoadCredential= ($CREDENTIALS_DIRECTORY), which
// is only known when the service starts.
const CredentialsPrefix = "${CREDENTIALS_DIRECTORY}/"

func (c *Config) tokenFile(path string) ([]byte, error) {
	const key = "job.token_file"
	if rest, ok := strings.CutPrefix(path, CredentialsPrefix); ok {
		dir := os.Getenv("CREDENTIALS_DIRECTORY")
		if dir == "" {
			return nil, c.errAt(key, fmt.Errorf("%w: %s names ${CREDENTIALS_DIRECTORY}, which is not set: run under systemd with LoadCredential=, or give an absolute path", ErrTokenInvalid, path))
		}
		path = filepath.Join(dir, rest)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, c.errAt(key, fmt.Errorf("%w: %w", ErrTokenInvalid, err))
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, c.errAt(key, fmt.Errorf("%w: %w", ErrTokenInvalid, err))
	}
	// Stat of the open file, not of the path: the checked file is the
	// read one even if the path is swapped meanwhile.
	if !fi.Mode().IsRegular() {
		return nil, c.errAt(key, fmt.Errorf("%w: %s is not a regular file (%v)", ErrTokenInvalid, path, fi.Mode().Type()))
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, c.errAt(key, fmt.Errorf("%w: %s has mode %04o; run: chmod 600 %s", ErrTokenInsecure, path, uint32(perm), path))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxTokenBytes+1))
	if err != nil {
		return nil, c.errAt(key, fmt.Errorf("%w: read %s: %w", ErrTokenInvalid, path, err))
	}
	if len(data) > MaxTokenBytes {
		return nil, c.errAt(key, fmt.Errorf("%w: %s is larger than %d bytes; is it the token?", ErrTokenInvalid, path, MaxTokenBytes))
	}
	return c.checkToken(key, path, data)
}

func (c *Config) checkToken(key, from string, tok []byte) ([]byte, error) {
	tok = bytes.TrimRight(tok, "\r\n")
	if len(tok) == 0 {
		return nil, c.errAt(key, fmt.Errorf("%w: %s is empty", ErrTokenInvalid, from))
	}
	if len(tok) < MinTokenBytes {
		return nil, c.errAt(key, fmt.Errorf("%w: %s holds %d bytes; a token needs at least %d (e.g. head -c 32 /dev/urandom | base64)",
			ErrTokenInvalid, from, len(tok), MinTokenBytes))
	}
	return bytes.Clone(tok), nil
}
