package config

import (
	"errors"
	"strings"
	"testing"
)

// base is the smallest valid config; cases append sections from line 7.
const base = `job:
  name: demo
  token_env: TOK
peers:
  - 127.0.0.1:7101
  - 127.0.0.1:7102
`

func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	c, err := Parse([]byte(src), "config.yaml")
	if err != nil {
		t.Fatalf("Parse:\n%s\nunexpected error:\n%v", src, err)
	}
	return c
}

// mustFail parses src and checks that the error holds every want (each
// normally "config.yaml:LINE: key: message").
func mustFail(t *testing.T, src string, want ...string) error {
	t.Helper()
	c, err := Parse([]byte(src), "config.yaml")
	if err == nil {
		t.Fatalf("Parse:\n%s\nsucceeded (%+v); want error %q", src, c, want)
	}
	if c != nil {
		t.Errorf("Parse returned a config with its error")
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("error does not match ErrInvalid: %v", err)
	}
	var list ErrorList
	if !errors.As(err, &list) || len(list) == 0 {
		t.Errorf("error is not a non-empty ErrorList: %T", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("Parse:\n%s\nerror:\n%v\nwant it to contain:\n%s", src, err, w)
		}
	}
	return err
}
