package main

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestLimitCommands: limit set caps a kind across the fleet, a job over
// it shows as waiting with the reason in jobs get, limit ls shows the slot
// taken, bad limits are refused naming what is wrong, and limit rm lets
// the waiting job start.
func TestLimitCommands(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	env := fleettest.NewEnv(t, srv, topology.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	startSupervisor(ctx, t, srv)
	cli := cliOn(ctx, srv)
	out, err := cli("limit", "set", "default", "export", "-concurrency", "1", "-rate", "100/1m")
	require.NoError(t, err, out)
	assert.Equal(t, "limit set: default/export concurrency 1, rate 100 per 1m0s\n"+
		"note: no queue default exists yet; its jobs are dead-lettered as unroutable until an agent serves it, "+
		"it is declared under topology.queues, or `jetfleet queue add default` creates it\n", out, "no agent has served default yet")

	a, err := agent.New(env.Env.Conn, agent.Config{ID: "cli-limit"}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	finish := make(chan struct{})
	require.NoError(t, a.Register("export", func(ctx context.Context, _ *agent.Job) error {
		select {
		case <-finish:
		case <-ctx.Done():
		}
		return nil
	}, agent.KindOptions{}))
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Stop(stopCtx)
	})
	_, err = cli("submit", "default", "export", "-id", "export-1", `{}`)
	require.NoError(t, err)
	fleettest.WaitLatestEvent(t, env.JetStream, "export-1", protocol.EventStarted, 10*time.Second)
	_, err = cli("submit", "default", "export", "-id", "export-2", `{}`)
	require.NoError(t, err)
	fleettest.WaitLatestEvent(t, env.JetStream, "export-2", protocol.EventWaiting, 10*time.Second)

	out, err = cli("jobs", "get", "export-2")
	require.NoError(t, err)
	assert.Regexp(t, `STATE\s+waiting\n`, out)
	assert.Contains(t, out, "fleet-wide concurrency of default.export: 1 of 1 running")

	out, err = cli("limit", "ls")
	require.NoError(t, err)
	assert.Regexp(t, `(?m)^default\s+export\s+1\s+1\s+100/1m0s\s`, out)
	out, err = cli("limit", "ls", "-o", "json")
	require.NoError(t, err)
	var limits []jetfleet.LimitInfo
	require.NoError(t, json.Unmarshal([]byte(out), &limits), out)
	require.Len(t, limits, 1)
	assert.Equal(t, 1, limits[0].Running)
	assert.Equal(t, "1m0s", limits[0].Period)

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"limit", "set", "default", "export", "-rate", "0/1m"}, "above zero"},
		{[]string{"limit", "set", "default", "export", "-rate", "5"}, "want R/period"},
		{[]string{"limit", "set", "default", "export", "-rate", "5/soon"}, "positive duration"},
		{[]string{"limit", "set", "default", "export"}, "give -concurrency N"},
		{[]string{"limit", "set", "default", "export", "-concurrency", "-2"}, "concurrency -2 is out of range"},
		{[]string{"limit", "set", "default"}, "the <kind>"},
		{[]string{"limit", "rm", "default", "nosuchkind"}, "has no fleet-wide limit"},
	} {
		_, err := cli(bad.args...)
		require.Error(t, err, "%v", bad.args)
		assert.Contains(t, err.Error(), bad.want, "%v", bad.args)
	}

	// A limit of a queue that does not exist is stored, with a note.
	out, err = cli("limit", "set", "nosuchqueue", "export", "-concurrency", "2")
	require.NoError(t, err, out)
	assert.Equal(t, "limit set: nosuchqueue/export concurrency 2\n"+
		"note: no queue nosuchqueue exists yet; its jobs are dead-lettered as unroutable until an agent serves it, "+
		"it is declared under topology.queues, or `jetfleet queue add nosuchqueue` creates it\n", out)
	_, err = cli("limit", "rm", "nosuchqueue", "export")
	require.NoError(t, err)

	out, err = cli("limit", "rm", "default", "export")
	require.NoError(t, err)
	assert.Equal(t, "limit lifted: default/export\n", out)
	fleettest.WaitLatestEvent(t, env.JetStream, "export-2", protocol.EventStarted, 10*time.Second)
	close(finish)
	fleettest.WaitLatestEvent(t, env.JetStream, "export-2", protocol.EventSucceeded, 10*time.Second)

	var perr *protocol.Error
	err = jetfleet.NewClient(env.Env.Conn).SetLimit(ctx, "default", "export", jetfleet.KindLimit{Period: time.Minute})
	require.True(t, errors.As(err, &perr), "%v", err)
	assert.Equal(t, protocol.CodeInvalidArgument, perr.Code)
	assert.Contains(t, err.Error(), "a rate of zero starts nothing")
}
