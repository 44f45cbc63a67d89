package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func TestMain(m *testing.M) {
	natstest.VerifyNoLeaks(m)
}

// TestScheduleCommand drives every schedule subcommand against a real
// server and scheduler replica.
func TestScheduleCommand(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))
	env := &service.Env{Name: "scheduler", Base: &service.Base{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Conn: nc, JetStream: js}
	s, err := scheduler.New(scheduler.Config{}, env, clock.Real())
	require.NoError(t, err)
	require.NoError(t, s.Start(ctx))
	t.Cleanup(func() { _ = s.Stop(context.Background()) })

	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		full := append([]string{"schedule", args[0], "-server", srv.ClientURL()}, args[1:]...)
		err := run(ctx, full, &out)
		return out.String(), err
	}
	out, err := cli("add", "-cron", "0 7 * * 1-5", "-zone", "Europe/Berlin", "-kind", "report", "-payload", `{"a":1}`,
		"-overlap", "skip", "-job-timeout", "5m", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "schedule nightly stored")
	assert.Contains(t, out, "next: ")

	_, err = cli("add", "-cron", "61 * * * *", "-kind", "report", "broken")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.cron")

	out, err = cli("add", "-replace", "-every", "1h", "-kind", "report", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "stored (revision 2)")

	out, err = cli("ls")
	require.NoError(t, err)
	assert.Contains(t, out, "nightly")
	assert.Contains(t, out, "every 3600s")

	out, err = cli("preview", "-cron", "30 2 * * *", "-zone", "America/New_York", "-from", "2026-03-07T12:00:00Z", "-count", "2")
	require.NoError(t, err)
	assert.Equal(t, "2026-03-08T03:30:00-04:00\n2026-03-09T02:30:00-04:00\n", out, "the spring-forward gap fires once, shifted")

	out, err = cli("pause", "-note", "maintenance", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "paused")
	out, err = cli("get", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, `"note": "maintenance"`)
	_, err = cli("resume", "nightly")
	require.NoError(t, err)

	out, err = cli("trigger", "nightly")
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(out, "fired job sched.nightly.manual."), out)

	from := time.Now().Add(-3 * time.Hour).UTC().Format(time.RFC3339)
	to := time.Now().UTC().Format(time.RFC3339)
	out, err = cli("backfill", "-from", from, "-to", to, "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "fired 3 ")

	out, err = cli("rm", "nightly")
	require.NoError(t, err)
	assert.Contains(t, out, "removed")
	_, err = cli("get", "nightly")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not_found")

	jobs, err := js.Stream(ctx, "JOBS")
	require.NoError(t, err)
	info, err := jobs.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), info.State.Msgs, "one trigger and three backfilled hours")
}
