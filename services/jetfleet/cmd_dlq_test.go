package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
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

// TestSupervisorCommands drives dlq, jobs, agents and status against a
// real server, supervisor replica and agent.
func TestSupervisorCommands(t *testing.T) {
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
	a, err := agent.New(agentEnv.Env.Conn, agent.Config{ID: "cli-agent"}, agent.WithEnv(agentEnv.Env))
	require.NoError(t, err)
	var healthy atomic.Bool
	require.NoError(t, a.Register("invoice", func(context.Context, *agent.Job) error {
		if !healthy.Load() {
			return agent.NonRetryable(errors.New("tax service down"))
		}
		return nil
	}, agent.KindOptions{}))
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Stop(stopCtx)
	})
	events := fleettest.WatchJobEvents(t, natstest.Connect(t, srv))

	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		n := 1 // the command, then its subcommand for groups
		if args[0] == "dlq" || args[0] == "jobs" || args[0] == "agents" || args[0] == "queue" {
			n = 2
		}
		full := append(append(append([]string(nil), args[:n]...), "-server", srv.ClientURL()), args[n:]...)
		err := run(ctx, full, &out)
		return out.String(), err
	}
	_, err = cli("submit", "-id", "inv-1", "default", "invoice", `{"n":1}`)
	require.NoError(t, err)
	events.WaitFor(t, 10*time.Second, "inv-1", protocol.EventDead)

	var seq uint64
	require.Eventually(t, func() bool {
		out, err := cli("dlq", "ls", "-o", "json", "-kind", "invoice", "-since", "1h")
		if err != nil {
			return false
		}
		var letters []jetfleet.DeadLetterEntry
		if json.Unmarshal([]byte(out), &letters) != nil || len(letters) != 1 {
			return false
		}
		seq = letters[0].Sequence
		return true
	}, 10*time.Second, 20*time.Millisecond)
	seqArg := strconv.FormatUint(seq, 10)
	out, err := cli("dlq", "ls")
	require.NoError(t, err)
	assert.Contains(t, out, "inv-1")
	assert.Contains(t, out, "tax service down")
	out, err = cli("dlq", "show", seqArg)
	require.NoError(t, err)
	assert.Regexp(t, `REASON\s+non_retryable`, out)
	assert.Regexp(t, `PAYLOAD\s+\{"n":1\}`, out)
	out, err = cli("dlq", "show", seqArg, "-o", "json") // flags may follow arguments
	require.NoError(t, err)
	assert.Contains(t, out, `"reason": "non_retryable"`)

	healthy.Store(true)
	out, err = cli("dlq", "replay", seqArg)
	require.NoError(t, err)
	assert.Contains(t, out, "replayed dead letter "+seqArg+" as job inv-1")
	events.WaitFor(t, 10*time.Second, "inv-1", protocol.EventSucceeded)

	// A refused action exits non-zero: the letter was replayed before.
	out, err = cli("dlq", "replay", seqArg)
	require.ErrorIs(t, err, errRefused)
	assert.Equal(t, 1, exitCode(err))
	assert.ErrorContains(t, err, "dead letter "+seqArg+" (job inv-1) was replayed before")
	assert.NotContains(t, out, "replayed dead letter")
	out, err = cli("dlq", "replay", "-o", "json", seqArg)
	require.ErrorIs(t, err, errRefused, "-o json still exits non-zero")
	var replay jetfleet.ReplayResponse
	require.NoError(t, json.Unmarshal([]byte(out), &replay), out)
	require.Len(t, replay.Results, 1)
	assert.True(t, replay.Results[0].AlreadyReplayed)
	out, err = cli("dlq", "replay", "-kind", "invoice")
	require.NoError(t, err, "a filtered replay skips letters replayed before and says so")
	assert.Contains(t, out, "1 dead letters were replayed before and skipped")

	// Seen on its subject, the event may not be stored yet: jobs get reads the stream.
	fleettest.WaitLatestEvent(t, supEnv.JetStream, "inv-1", protocol.EventSucceeded, 10*time.Second)
	out, err = cli("jobs", "get", "inv-1")
	require.NoError(t, err)
	assert.Regexp(t, `STATE\s+succeeded`, out)
	out, err = cli("jobs", "get", "-o", "json", "inv-1")
	require.NoError(t, err)
	assert.Contains(t, out, `"type": "succeeded"`)
	require.Eventually(t, func() bool {
		out, err = cli("jobs", "history", "-kind", "invoice")
		return err == nil && strings.Contains(out, "2 executions: 1 succeeded, 1 dead")
	}, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, out, "dead (non_retryable)")
	out, err = cli("jobs", "history", "-kind", "invoice", "-o", "json")
	require.NoError(t, err)
	var history struct {
		Executions []struct {
			Duration any `json:"duration"`
		} `json:"executions"`
		Stats struct {
			P50 any `json:"p50"`
			P95 any `json:"p95"`
		} `json:"stats"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &history), out)
	assertJSONDuration(t, history.Stats.P50, "stats.p50")
	assertJSONDuration(t, history.Stats.P95, "stats.p95")
	require.NotEmpty(t, history.Executions)
	assertJSONDuration(t, history.Executions[0].Duration, "executions[0].duration")
	// Running jobs are what the agent's latest heartbeat lists: the one
	// after the job ended may be a heartbeat interval away.
	require.Eventually(t, func() bool {
		out, err = cli("jobs", "ls")
		return err == nil && strings.Contains(out, "no running jobs")
	}, 10*time.Second, 20*time.Millisecond, "jobs ls lists no running job")
	out, err = cli("agents", "ls")
	require.NoError(t, err)
	assert.Contains(t, out, "cli-agent")
	assert.Contains(t, out, "alive")
	out, err = cli("agents", "ls", "-o", "json")
	require.NoError(t, err)
	var agents []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &agents), out)
	require.Len(t, agents, 1)
	assertJSONDuration(t, agents[0]["interval"], "interval")
	assertJSONDuration(t, agents[0]["silent_for"], "silent_for")
	assert.Equal(t, "cli-agent", agents[0]["id"], "the view keeps the other fields")
	out, err = cli("status")
	require.NoError(t, err)
	assert.Contains(t, out, "agents: 1 alive")
	assert.Contains(t, out, "dead letters: 1")
	out, err = cli("status", "-o", "json")
	require.NoError(t, err)
	var status struct {
		AgentsAlive int              `json:"agents_alive"`
		Queues      []map[string]any `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &status), out)
	assert.Equal(t, 1, status.AgentsAlive)
	require.NotEmpty(t, status.Queues)
	assert.Equal(t, "30s", status.Queues[0]["ack_wait"])

	// submit starts a span and sends traceparent: the agent's events carry the trace id submit prints.
	out, err = cli("submit", "-id", "traced-1", "default", "invoice", `{"n":2}`)
	require.NoError(t, err)
	traceID := printedTraceID(t, out)
	ev := events.WaitFor(t, 10*time.Second, "traced-1", protocol.EventSucceeded)
	assert.Equal(t, traceID, ev.GetTraceId(), "the job's events continue the trace of submit")
	out, err = cli("submit", "-id", "traced-2", "default", "invoice", "not JSON")
	require.NoError(t, err)
	traceID = printedTraceID(t, out)
	ev = events.WaitFor(t, 10*time.Second, "traced-2", protocol.EventSucceeded)
	assert.Equal(t, traceID, ev.GetTraceId(), "a payload published byte for byte carries the trace too")

	out, err = cli("queue", "add", "-ack-wait", "2m", "reports")
	require.NoError(t, err)
	assert.Contains(t, out, "queue created: reports (ack wait 2m0s, max deliver 20)", "tables print Go durations")
	out, err = cli("queue", "add", "-ack-wait", "2m", "-o", "json", "reports")
	require.NoError(t, err)
	var added struct {
		Queue struct {
			Queue   string `json:"queue"`
			AckWait string `json:"ack_wait"`
		} `json:"queue"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &added), out)
	assert.Equal(t, "reports", added.Queue.Queue)
	assert.Equal(t, "120s", added.Queue.AckWait)
	out, err = cli("queue", "ls")
	require.NoError(t, err)
	assert.Contains(t, out, "reports")
	assert.Contains(t, out, "default")
	out, err = cli("queue", "ls", "-o", "json")
	require.NoError(t, err)
	assert.Contains(t, out, `"ack_wait": "120s"`)
	_, err = cli("queue", "add")
	require.ErrorContains(t, err, "queue add needs the <queue>")
	assert.Equal(t, 2, exitCode(err))
	out, err = cli("queue", "rm", "reports")
	require.NoError(t, err)
	assert.Contains(t, out, "queue removed: reports")
	_, err = cli("queue", "rm", "reports")
	require.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound), "removing a queue twice")
	assert.Equal(t, 1, exitCode(err))

	_, err = cli("dlq", "purge")
	require.ErrorContains(t, err, "dlq purge needs the dead letter <sequence>, a filter flag or -all")
	_, err = cli("dlq", "purge", strconv.FormatUint(seq+1000, 10))
	require.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound), "purging a letter that is not there is refused")
	assert.Equal(t, 1, exitCode(err))
	out, err = cli("dlq", "purge", "-all")
	require.NoError(t, err)
	assert.Contains(t, out, "purged 1 dead letters")
	out, err = cli("dlq", "ls")
	require.NoError(t, err)
	assert.Contains(t, out, "no dead letters")
}

// assertJSONDuration checks that v is a duration as the CLI prints them in
// JSON: a string of seconds with an "s" suffix.
func assertJSONDuration(t *testing.T, v any, what string) {
	t.Helper()
	s, ok := v.(string)
	if assert.True(t, ok, "%s is %T %v, not a string", what, v, v) {
		assert.Regexp(t, `^[0-9]+(\.[0-9]+)?s$`, s, what)
	}
}

// printedTraceID reads the trace id submit prints.
func printedTraceID(t *testing.T, out string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^trace ([0-9a-f]{32})$`).FindStringSubmatch(out)
	require.NotNil(t, m, "submit prints the trace id: %s", out)
	return m[1]
}

// TestJobsCancelCommand: jobs cancel removes a queued job and says where it
// was; cancelling it again is refused (exit 1); a filter that matches
// nothing says so.
func TestJobsCancelCommand(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	supEnv := fleettest.NewEnv(t, srv, topology.Config{})
	sup, err := supervisor.New(supervisor.Config{CheckInterval: 50 * time.Millisecond}, supEnv.Env, clock.Real())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, sup.Start(ctx))
	t.Cleanup(func() { _ = sup.Stop(context.Background()) })
	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(args, "-server", srv.ClientURL()), &out)
		return out.String(), err
	}
	_, err = cli("submit", "-id", "nightly-report", "reports", "render", `{}`)
	require.NoError(t, err)

	out, err := cli("jobs", "cancel", "nightly-report", "-reason", "report no longer needed")
	require.NoError(t, err)
	assert.Regexp(t, `nightly-report\s+queued`, out)
	ev := fleettest.WaitLatestEvent(t, supEnv.JetStream, "nightly-report", protocol.EventCancelled, 10*time.Second)
	assert.Contains(t, ev.GetError(), "report no longer needed")

	_, err = cli("jobs", "cancel", "nightly-report")
	assert.Equal(t, 1, exitCode(err), "%v", err)
	assert.ErrorContains(t, err, "already ended: cancelled")

	out, err = cli("jobs", "cancel", "-kind", "render", "-o", "json")
	require.NoError(t, err)
	var res jetfleet.CancelResponse
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	assert.Empty(t, res.Results)

	// A delayed job: submit -in, jobs get, status, then cancel.
	out, err = cli("submit", "-id", "reminder", "-in", "1h", "reports", "render", `{}`)
	require.NoError(t, err)
	assert.Contains(t, out, "delayed job reminder until ")
	out, err = cli("jobs", "get", "reminder")
	require.NoError(t, err)
	assert.Regexp(t, `DELAYED\s+until \S+ \(in (59m5\ds|1h0m0s)\), queue reports, kind render`, out)
	out, err = cli("status")
	require.NoError(t, err)
	assert.Contains(t, out, "delayed jobs: 1")
	out, err = cli("jobs", "cancel", "reminder")
	require.NoError(t, err)
	assert.Regexp(t, `reminder\s+delayed`, out)
	_, err = cli("submit", "-at", "noon", "reports", "render", `{}`)
	assert.Equal(t, 2, exitCode(err), "%v", err)
	assert.ErrorContains(t, err, `-at "noon" is not an RFC 3339 time`)

	_, err = cli("jobs", "cancel")
	assert.Equal(t, 2, exitCode(err), "%v", err)
	assert.ErrorContains(t, err, "jobs cancel needs a <job_id>, or -queue, -kind or -schedule")
}
