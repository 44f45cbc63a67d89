package supervisor_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestReplicasActOnce runs two supervisor replicas: both track the agents
// and answer the API, one acts. A killed agent's jobs get one rescued
// event each; when the leader stops, the other replica takes over and
// rescues the jobs of the next agent that dies.
func TestReplicasActOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	cfg := fast(supervisor.Config{MissedHeartbeats: 3})
	s1, stop1 := f.startSupervisor(t, cfg, nil)
	s2, stop2 := f.startSupervisor(t, cfg, nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	waitFor(t, 20*time.Second, "a leader", func() bool { return s1.IsLeader() || s2.IsLeader() })
	require.False(t, s1.IsLeader() && s2.IsLeader(), "one leader")
	leader, follower, stopLeader := s1, s2, stop1
	if s2.IsLeader() {
		leader, follower, stopLeader = s2, s1, stop2
	}

	doomed := func(id string, jobs int, prefix string) *testAgent {
		held := make(chan string, jobs)
		a := f.startAgent(t, "", agent.Config{ID: id, Concurrency: jobs, HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
			must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
				held <- job.ID
				<-ctx.Done()
				return ctx.Err()
			}, agent.KindOptions{}))
		})
		beats := watchHeartbeats(t, f.nc, id)
		for i := range jobs {
			fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("%s-%d", prefix, i), Queue: "default", Kind: "work"})
		}
		for range jobs {
			select {
			case <-held:
			case <-time.After(15 * time.Second):
				t.Fatalf("%s does not hold its jobs", id)
			}
		}
		beats.wait(t, 10*time.Second, time.Time{}, func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == jobs })
		return a
	}
	worker := func(id string) *testAgent {
		return f.startAgent(t, "", agent.Config{ID: id, Concurrency: 10, HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
			must(t, a.Register("work", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
		})
	}
	first := doomed("doomed-1", 5, "ha")
	w1 := worker("worker-1")
	first.kill()
	for i := range 5 {
		f.events.WaitFor(t, 15*time.Second, fmt.Sprintf("ha-%d", i), protocol.EventSucceeded)
	}
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
	for i := range 5 {
		assert.Equal(t, 1, countEvents(f.events, fmt.Sprintf("ha-%d", i), protocol.EventRescued), "one replica rescued ha-%d", i)
	}
	// Both replicas see the agent dead; either answers the API.
	waitFor(t, 5*time.Second, "both replicas to see doomed-1 dead", func() bool {
		return s1.AgentStates()["doomed-1"] == jetfleet.AgentDead && s2.AgentStates()["doomed-1"] == jetfleet.AgentDead
	})
	status, err := f.client.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, leader.Holder(), status.Leader)
	assert.Contains(t, []string{s1.Holder(), s2.Holder()}, status.Replica)
	assert.Equal(t, 1, status.AgentsDead, "%+v", status)

	// The leader goes; the follower takes over and acts.
	require.NoError(t, w1.Stop(ctx))
	stopLeader()
	require.NoError(t, follower.WaitLeading(ctx, true))
	second := doomed("doomed-2", 3, "hb")
	worker("worker-2")
	second.kill()
	for i := range 3 {
		id := fmt.Sprintf("hb-%d", i)
		f.events.WaitFor(t, 15*time.Second, id, protocol.EventSucceeded)
		assert.Equal(t, 1, countEvents(f.events, id, protocol.EventRescued))
	}
	status, err = f.client.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, follower.Holder(), status.Leader)
}
