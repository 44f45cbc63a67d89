package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestWithTheAgentSDK runs scheduled jobs on the Go agent: cancel_previous
// cancels the agent's running job through its control subject, and a
// dependency fires from the agent's succeeded event.
func TestWithTheAgentSDK(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	events := watchScheduleEvents(t, f.nc)
	jobs := watchJobEvents(t, f.nc)
	g := newGates()
	env := newEnv(t, f.url, f.topo).Env
	a, err := agent.New(env.Conn, agent.Config{ID: "agent-e2e", Queues: []string{"default"}}, agent.WithEnv(env))
	require.NoError(t, err)
	require.NoError(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
		select {
		case <-g.of(job.ID):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, agent.KindOptions{}))
	require.NoError(t, a.Register("followup", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	require.NoError(t, a.Start(ctx(t, 30*time.Second)))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = a.Stop(stopCtx)
	})

	clk := clock.NewFake(utc(overlapStart))
	r := f.replica(scheduler.Config{}, clk)
	waitLeading(t, r)
	c := ctx(t, 60*time.Second)
	def := interval("ov", 10*time.Second, "work")
	def.Policy.Overlap = jetfleet.OverlapCancelPrevious
	_, err = f.client.AddSchedule(c, def)
	require.NoError(t, err)
	_, err = f.client.AddSchedule(c, &jetfleet.Schedule{ID: "after-ov", Spec: jetfleet.Spec{After: &jetfleet.Dependency{On: []jetfleet.Upstream{{ScheduleID: "ov"}}}},
		Target: jetfleet.Target{Queue: "default", Kind: "followup"}})
	require.NoError(t, err)
	require.NoError(t, r.WaitSynced(c))

	first, second := nominalJob(10*time.Second), nominalJob(20*time.Second)
	clk.Set(utc(overlapStart).Add(10 * time.Second))
	require.NoError(t, r.Kick(c))
	jobs.waitFor(t, first, protocol.EventStarted)
	clk.Set(utc(overlapStart).Add(20 * time.Second))
	require.NoError(t, r.Kick(c))
	jobs.waitFor(t, first, protocol.EventCancelled)
	jobs.waitFor(t, second, protocol.EventStarted)
	g.release(second)
	jobs.waitFor(t, second, protocol.EventSucceeded)

	fired := events.waitN(t, "after-ov", protocol.EventFired, 1)
	assert.Equal(t, utc(overlapStart).Add(20*time.Second), fired[0].GetNominalTime().AsTime(), "the cancelled run did not succeed: only the second one counts")
	jobs.waitFor(t, fired[0].GetJobId(), protocol.EventSucceeded)
}
