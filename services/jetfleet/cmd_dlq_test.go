package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
		out, err := cli("dlq", "ls", "-json", "-kind", "invoice", "-since", "1h")
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
	out, err := cli("dlq", "ls")
	require.NoError(t, err)
	assert.Contains(t, out, "inv-1")
	assert.Contains(t, out, "tax service down")
	out, err = cli("dlq", "show", strconv.FormatUint(seq, 10))
	require.NoError(t, err)
	assert.Contains(t, out, `"reason": "non_retryable"`)

	healthy.Store(true)
	out, err = cli("dlq", "replay", strconv.FormatUint(seq, 10))
	require.NoError(t, err)
	assert.Contains(t, out, "replayed dead letter "+strconv.FormatUint(seq, 10)+" as job inv-1")
	events.WaitFor(t, 10*time.Second, "inv-1", protocol.EventSucceeded)
	out, err = cli("dlq", "replay", strconv.FormatUint(seq, 10))
	require.NoError(t, err)
	assert.Contains(t, out, "was replayed before")

	// Seen on its subject, the event may not be stored yet: jobs get reads the stream.
	fleettest.WaitLatestEvent(t, supEnv.JetStream, "inv-1", protocol.EventSucceeded, 10*time.Second)
	out, err = cli("jobs", "get", "inv-1")
	require.NoError(t, err)
	assert.Contains(t, out, `"type": "succeeded"`)
	require.Eventually(t, func() bool {
		out, err = cli("jobs", "history", "-kind", "invoice")
		return err == nil && strings.Contains(out, "2 executions: 1 succeeded, 1 dead")
	}, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, out, "dead (non_retryable)")
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
	out, err = cli("status")
	require.NoError(t, err)
	assert.Contains(t, out, "agents: 1 alive")
	assert.Contains(t, out, "dead letters: 1")

	out, err = cli("queue", "add", "-ack-wait", "2m", "reports")
	require.NoError(t, err)
	assert.Contains(t, out, "queue created: reports (ack wait 2m0s, max deliver 20)")
	out, err = cli("queue", "ls")
	require.NoError(t, err)
	assert.Contains(t, out, "reports")
	assert.Contains(t, out, "default")
	_, err = cli("queue", "add")
	require.ErrorContains(t, err, "queue add needs the <queue> name")
	out, err = cli("queue", "rm", "reports")
	require.NoError(t, err)
	assert.Contains(t, out, "queue removed: reports")
	_, err = cli("queue", "rm", "reports")
	require.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound), "removing a queue twice")

	_, err = cli("dlq", "purge")
	require.Error(t, err, "purging everything needs -all")
	out, err = cli("dlq", "purge", "-all")
	require.NoError(t, err)
	assert.Contains(t, out, "purged 1 dead letters")
	out, err = cli("dlq", "ls")
	require.NoError(t, err)
	assert.Contains(t, out, "no dead letters")
}
