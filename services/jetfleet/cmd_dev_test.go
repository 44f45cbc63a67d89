package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestDevThenSubmit runs `jetfleet dev` and `jetfleet submit` as the README
// shows them (on a free port and a temporary data directory), then stops
// the fleet the way Ctrl-C does.
func TestDevThenSubmit(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncBuffer{}
	devDone := make(chan error, 1)
	go func() {
		devDone <- run(ctx, []string{"dev", "-set", "embedded.port=-1", "-set", "embedded.data_dir=" + t.TempDir(),
			"-set", "telemetry.http_addr=127.0.0.1:0", "-set", "telemetry.log_level=warn", "-set", "dashboard.listen=127.0.0.1:0"}, out)
	}()
	var url string
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(out.String(), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "NATS" {
				url = f[3]
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "jetfleet dev prints where NATS is: %s", out)
	assert.Contains(t, out.String(), "jetfleet dev fleet is running")

	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	events := fleettest.WatchJobEvents(t, nc)

	var submitOut bytes.Buffer
	require.NoError(t, run(ctx, []string{"submit", "-server", url, "-id", "readme-1", "default", "echo", `{"hello":"world"}`}, &submitOut))
	assert.Contains(t, submitOut.String(), "published job readme-1 to jobs.default.echo")
	events.WaitFor(t, 20*time.Second, "readme-1", protocol.EventSucceeded)

	submitOut.Reset()
	require.NoError(t, run(ctx, []string{"submit", "-server", url, "-id", "readme-1", "default", "echo", `{"hello":"world"}`}, &submitOut))
	assert.Contains(t, submitOut.String(), "duplicate: job readme-1 was already published")

	err = run(ctx, []string{"submit", "-server", url, "default", "a.b"}, io.Discard)
	assert.ErrorContains(t, err, "invalid kind")

	cancel()
	select {
	case err := <-devDone:
		require.NoError(t, err, "Ctrl-C stops the fleet cleanly")
	case <-time.After(60 * time.Second):
		t.Fatal("jetfleet dev did not stop")
	}
}

func TestConfigPrint(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"config", "print", "dev", "-set", "nats.user=bob", "-set", "nats.password=hunter2"}, &out))
	assert.Contains(t, out.String(), "password: <redacted>")
	assert.NotContains(t, out.String(), "hunter2")
	assert.Contains(t, out.String(), "lease_ttl: 5s", "defaults are shown applied")

	err := run(context.Background(), []string{"config", "print", "dev", "-set", "agent.concurency=3"}, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "agent.concurency")
	assert.Contains(t, err.Error(), "unknown key")
	err = run(context.Background(), []string{"config", "print", "nosuch"}, io.Discard)
	assert.ErrorContains(t, err, `unknown service "nosuch"`)
}
