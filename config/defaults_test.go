package config

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/collectived/collectived/ipc"
	"github.com/collectived/collectived/rendezvous"
	"github.com/collectived/collectived/ring"
)

// The ring, socket and rendezvous defaults are declared once, by the
// packages that use them; config refers to them. This keeps the packages'
// own DefaultConfigs and config.yaml's comments, which cannot refer to a
// constant, in agreement with that declaration.
func TestDefaultsDeclaredOnce(t *testing.T) {
	d := Default()
	if got := int64(ring.DefaultConfig().SegmentBytes); got != d.Ring.SegmentBytes {
		t.Errorf("ring.DefaultConfig segment %d, config %d", got, d.Ring.SegmentBytes)
	}
	if got := ipc.DefaultServerConfig().ShmQuota; got != d.Limits.ShmQuotaBytes {
		t.Errorf("ipc.DefaultServerConfig shm quota %d, config %d", got, d.Limits.ShmQuotaBytes)
	}
	if got := ipc.DefaultServerConfig().MaxInFlight; got != d.Limits.MaxInFlight {
		t.Errorf("ipc.DefaultServerConfig max in flight %d, config %d", got, d.Limits.MaxInFlight)
	}
	if got := rendezvous.DefaultConfig().Streams; got != d.Ring.Streams {
		t.Errorf("rendezvous.DefaultConfig streams %d, config %d", got, d.Ring.Streams)
	}

	text, err := os.ReadFile("../config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		want int64
	}{
		{"streams", int64(d.Ring.Streams)},
		{"segment_bytes", d.Ring.SegmentBytes},
		{"shm_quota_bytes", d.Limits.ShmQuotaBytes},
		{"max_in_flight", int64(d.Limits.MaxInFlight)},
	} {
		doc := documentedDefault(t, string(text), c.key)
		got, err := ParseSize(doc)
		if err != nil {
			got, err = strconv.ParseInt(doc, 10, 64)
		}
		if err != nil || got != c.want {
			t.Errorf("config.yaml documents %s default %q, the code's is %d", c.key, doc, c.want)
		}
	}
}

var defaultRE = regexp.MustCompile(`Default "?([^".\s]+)"?\.`)

// documentedDefault is the value of the last "Default X." in the comment
// block just above key in config.yaml.
func documentedDefault(t *testing.T, text, key string) string {
	t.Helper()
	lines := strings.Split(text, "\n")
	for i, ln := range lines {
		if strings.TrimSpace(ln) != key+":" && !strings.HasPrefix(strings.TrimSpace(ln), key+": ") {
			continue
		}
		var block []string
		for j := i - 1; j >= 0 && strings.HasPrefix(strings.TrimSpace(lines[j]), "#"); j-- {
			block = append([]string{strings.TrimSpace(lines[j])}, block...)
		}
		m := defaultRE.FindAllStringSubmatch(strings.Join(block, " "), -1)
		if len(m) == 0 {
			t.Fatalf("config.yaml documents no default for %s", key)
		}
		return m[len(m)-1][1]
	}
	t.Fatalf("config.yaml has no key %s", key)
	return ""
}
