package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestJobsShowProgress: jobs get prints a running job's progress on a
// PROGRESS line, jobs ls in a PROGRESS column, and -o json has it.
func TestJobsShowProgress(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	supEnv := fleettest.NewEnv(t, srv, topology.Config{})
	sup, err := supervisor.New(supervisor.Config{CheckInterval: 50 * time.Millisecond}, supEnv.Env, clock.Real())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, sup.Start(ctx))
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })

	agentEnv := fleettest.NewEnv(t, srv, topology.Config{})
	a, err := agent.New(agentEnv.Env.Conn, agent.Config{ID: "cli-progress"}, agent.WithEnv(agentEnv.Env))
	require.NoError(t, err)
	finish := make(chan struct{})
	require.NoError(t, a.Register("resize", func(ctx context.Context, _ *agent.Job) error {
		if err := agent.ReportProgress(ctx, 0.4, "resizing image 4 of 10"); err != nil {
			return err
		}
		<-finish
		return nil
	}, agent.KindOptions{}))
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Stop(stopCtx)
	})
	defer close(finish)

	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		full := append(append(append([]string(nil), args[:2]...), "-server", srv.ClientURL()), args[2:]...)
		err := run(ctx, full, &out)
		return out.String(), err
	}
	_, err = cli("submit", "default", "resize", "-id", "img-7", `{}`)
	require.NoError(t, err)
	fleettest.WaitLatestEvent(t, supEnv.JetStream, "img-7", protocol.EventProgress, 10*time.Second)

	out, err := cli("jobs", "get", "img-7")
	require.NoError(t, err)
	assert.Regexp(t, `STATE\s+running\n`, out)
	assert.Regexp(t, `PROGRESS\s+40% — resizing image 4 of 10 \(reported `, out)

	// The running view shows it once a heartbeat lists the report.
	require.Eventually(t, func() bool {
		out, err = cli("jobs", "ls")
		return err == nil && strings.Contains(out, "40% — resizing image 4 of 10")
	}, 10*time.Second, 20*time.Millisecond, "jobs ls shows the progress: %s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	assert.Regexp(t, `\bPROGRESS$`, lines[0])
	assert.Regexp(t, `^img-7\s+default\s+resize\s+cli-progress\s.*\brunning\s+40% — resizing image 4 of 10$`, lines[1])

	out, err = cli("jobs", "ls", "-o", "json")
	require.NoError(t, err)
	var running []jetfleet.RunningJob
	require.NoError(t, json.Unmarshal([]byte(out), &running), out)
	require.Len(t, running, 1)
	require.NotNil(t, running[0].Progress)
	assert.Equal(t, 0.4, running[0].Progress.Fraction)
	assert.Contains(t, out, `"message": "resizing image 4 of 10"`)

	out, err = cli("jobs", "get", "-o", "json", "img-7")
	require.NoError(t, err)
	var detail jetfleet.JobDetail
	require.NoError(t, json.Unmarshal([]byte(out), &detail), out)
	require.NotNil(t, detail.Progress)
	assert.Equal(t, "resizing image 4 of 10", detail.Progress.Message)
	assert.Contains(t, out, `"fraction": 0.4`)
}

// TestJobsGetShowsTheResult: jobs get prints a succeeded job's result on a
// RESULT line, and -o json has it as JSON.
func TestJobsGetShowsTheResult(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	env := fleettest.NewEnv(t, srv, topology.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	startSupervisor(ctx, t, srv)
	a, err := agent.New(env.Env.Conn, agent.Config{ID: "cli-result"}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	require.NoError(t, a.Register("count", func(ctx context.Context, _ *agent.Job) error {
		return agent.RecordResult(ctx, map[string]int{"rows": 42})
	}, agent.KindOptions{}))
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Stop(stopCtx)
	})
	cli := cliOn(ctx, srv)
	_, err = cli("submit", "default", "count", "-id", "count-7", `{}`)
	require.NoError(t, err)
	fleettest.WaitLatestEvent(t, env.JetStream, "count-7", protocol.EventSucceeded, 10*time.Second)
	out, err := cli("jobs", "get", "count-7")
	require.NoError(t, err)
	assert.Regexp(t, `RESULT\s+\{"rows":42\}\n`, out)
	out, err = cli("jobs", "get", "-o", "json", "count-7")
	require.NoError(t, err)
	assert.Contains(t, out, `"result": {`)
	var detail jetfleet.JobDetail
	require.NoError(t, json.Unmarshal([]byte(out), &detail), out)
	assert.JSONEq(t, `{"rows":42}`, string(detail.Result))
}
