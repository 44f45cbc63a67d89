package supervisor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestDeadAgentListsNoRunningJobs: `jetfleet agents ls` (the agents API)
// shows an agent declared dead with no running jobs, though its last
// heartbeat listed one.
func TestDeadAgentListsNoRunningJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: time.Minute}}})
	f.leader(t, supervisor.Config{}, nil)
	held := make(chan struct{}, 1)
	victim := f.startAgent(t, "", agent.Config{ID: "doomed", HeartbeatInterval: 200 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			held <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "held-1", Queue: "default", Kind: "work"})
	<-held
	ctx := fleettest.Ctx(t, 30*time.Second)
	require.Eventually(t, func() bool {
		res, err := f.client.Agents(ctx)
		return err == nil && len(res.Agents) == 1 && res.Agents[0].Jobs == 1
	}, 10*time.Second, 50*time.Millisecond, "the live agent lists its job")
	victim.kill()
	var dead jetfleet.AgentInfo
	require.Eventually(t, func() bool {
		res, err := f.client.Agents(ctx)
		if err != nil || len(res.Agents) != 1 {
			return false
		}
		dead = res.Agents[0]
		return dead.State == jetfleet.AgentDead
	}, 15*time.Second, 50*time.Millisecond, "the agent is declared dead")
	assert.Equal(t, 0, dead.Jobs, "a dead agent runs nothing")
}
