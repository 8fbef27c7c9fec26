package daemon_test

import (
	"testing"
	"time"

	"github.com/collectived/collectived/config"
	"github.com/collectived/collectived/daemon"
)

// The core's defaults are the ones config.yaml, the README and
// `collectived check` document, so that a daemon built in code behaves as
// one started from a minimal file.
func TestDefaultConfigMatchesFile(t *testing.T) {
	d, f := daemon.DefaultConfig(), config.Default()
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"local size", d.LocalSize, f.Job.LocalSize},
		{"socket mode", d.SocketMode, f.Socket.Mode},
		{"streams", d.Streams, f.Ring.Streams},
		{"segment bytes", int64(d.SegmentBytes), f.Ring.SegmentBytes},
		{"small bytes", int64(d.SmallBytes), f.Ring.SmallBytes},
		{"connect", d.ConnectTimeout, f.Timeouts.Connect},
		{"collective", d.CollectiveTimeout, f.Timeouts.Collective},
		{"first call", d.FirstCallTimeout, f.Timeouts.FirstCall},
		{"stall warning", d.StallWarning, f.Timeouts.StallWarning},
		{"hello", d.HelloTimeout, f.Timeouts.Hello},
		{"heartbeat", d.HeartbeatInterval, f.Timeouts.Heartbeat},
		{"heartbeat timeout", d.HeartbeatTimeout, f.Timeouts.HeartbeatTimeout},
		{"inline bytes", int64(d.InlineBytes), f.Limits.InlineBytes},
		{"shm quota", d.ShmQuota, f.Limits.ShmQuotaBytes},
		{"max segments", d.MaxSegments, f.Limits.MaxSegments},
		{"max in flight", d.MaxInFlight, f.Limits.MaxInFlight},
		{"max clients", d.MaxClients, f.Limits.MaxClients},
		{"spin (in-process daemons do not poll)", d.Spin, time.Duration(0)},
	} {
		if c.got != c.want {
			t.Errorf("%s: daemon default %v, documented %v", c.name, c.got, c.want)
		}
	}
}
