package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
)

// TestJobsLsByStateAndTrends: jetfleet jobs ls -state lists queued and
// finished jobs, jetfleet jobs trends prints a kind's buckets, and a bad
// state is refused naming the field.
func TestJobsLsByStateAndTrends(t *testing.T) {
	t.Parallel()
	cfg := devfleet.DefaultConfig()
	cfg.Embedded.Port, cfg.Embedded.DataDir, cfg.Telemetry.HTTPAddr = -1, t.TempDir(), ""
	cfg.Dashboard.Listen = devfleet.DashboardOff
	cfg.ApplyDefaults()
	fleet, err := devfleet.New(cfg, devfleet.Options{Logger: fleettest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, fleet.Start(fleettest.Ctx(t, 60*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = fleet.Stop(ctx)
	})
	nc := natstest.ConnectURL(t, fleet.ClientURL())
	client := jetfleet.NewClient(nc)
	ctx := fleettest.Ctx(t, 60*time.Second)
	res, err := client.Enqueue(ctx, cliEcho{Hello: "cli"})
	require.NoError(t, err)
	_, err = client.Wait(ctx, res.JobID)
	require.NoError(t, err)
	parked, err := client.Enqueue(ctx, cliEcho{}, jetfleet.WithQueue("parked"))
	require.NoError(t, err)
	_, err = client.AddQueue(ctx, jetfleet.QueueAddRequest{Queue: "parked"})
	require.NoError(t, err)

	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(append([]string{}, args...), "-server", fleet.ClientURL()), &out)
		return out.String(), err
	}
	out, err := run("jobs", "ls", "-state", "queued", "-queue", "parked")
	require.NoError(t, err)
	assert.Contains(t, out, parked.JobID)
	require.Eventually(t, func() bool {
		out, err = run("jobs", "ls", "-state", "succeeded")
		return err == nil && strings.Contains(out, res.JobID)
	}, 20*time.Second, 100*time.Millisecond, out)
	require.Eventually(t, func() bool {
		out, err = run("jobs", "trends", "-kind", "echo")
		return err == nil && strings.Contains(out, "kind.default.echo") && strings.Contains(out, "BUCKET")
	}, 20*time.Second, 100*time.Millisecond, out)
	require.Eventually(t, func() bool {
		out, err = run("jobs", "trends")
		return err == nil && strings.Contains(out, "kind.default.echo")
	}, 20*time.Second, 100*time.Millisecond, out)
	assert.Contains(t, out, "steady")
	_, err = run("jobs", "ls", "-state", "nope")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "state")
}

type cliEcho struct {
	Hello string `json:"hello"`
}

func (cliEcho) Kind() string { return "echo" }
