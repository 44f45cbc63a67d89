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
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestProgressIsVisibleWhileTheJobRuns: a handler's progress report is the
// job's status through the client (state running), in the supervisor's
// running view and job detail (from the agent's heartbeat), and in the
// JSON of both; once the job succeeds its status is succeeded, without
// progress, and the history holds one execution.
func TestProgressIsVisibleWhileTheJobRuns(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	const id = "resize-42"
	reported, finish := make(chan struct{}), make(chan struct{})
	a := f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("resize", func(ctx context.Context, job *agent.Job) error {
			if err := agent.ReportProgress(ctx, 0.4, "resizing image 4 of 10"); err != nil {
				return err
			}
			close(reported)
			<-finish
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "resize"})
	<-reported
	ctx := fleettest.Ctx(t, 30*time.Second)

	fleettest.WaitLatestEvent(t, f.js, id, protocol.EventProgress, 10*time.Second)
	info, err := f.client.Job(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.StateRunning, info.State)
	assert.False(t, info.Done())
	require.NotNil(t, info.Progress)
	assert.InDelta(t, 0.4, info.Progress.Fraction, 1e-9)
	assert.Equal(t, "resizing image 4 of 10", info.Progress.Message)
	assert.WithinDuration(t, time.Now(), info.Progress.Time, 10*time.Second)
	assert.Equal(t, "40% — resizing image 4 of 10", info.Progress.String())

	var running []jetfleet.RunningJob
	waitFor(t, 10*time.Second, "the running view with the progress", func() bool {
		res, err := f.client.RunningJobs(ctx, jetfleet.RunningJobsRequest{})
		require.NoError(t, err)
		running = res.Jobs
		return len(running) == 1 && running[0].Progress != nil
	})
	assert.Equal(t, id, running[0].JobID)
	assert.Equal(t, a.ID(), running[0].AgentID)
	assert.Equal(t, *info.Progress, *running[0].Progress, "the heartbeat carries the report the event does")

	detail, err := f.client.JobDetail(ctx, jetfleet.JobDetailRequest{JobID: id})
	require.NoError(t, err)
	require.NotNil(t, detail.Progress)
	assert.Equal(t, *info.Progress, *detail.Progress)
	require.Len(t, detail.Running, 1)
	assert.Equal(t, detail.Progress, detail.Running[0].Progress)
	ev, err := detail.Decode()
	require.NoError(t, err)
	assert.Equal(t, protocol.EventProgress, ev.GetType())

	close(finish)
	fleettest.WaitLatestEvent(t, f.js, id, protocol.EventSucceeded, 10*time.Second)
	done, err := f.client.Job(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, protocol.EventSucceeded, done.State)
	assert.Nil(t, done.Progress)
	waitFor(t, 10*time.Second, "the history record", func() bool {
		h, err := f.client.History(ctx, jetfleet.HistoryRequest{Kind: "resize"})
		require.NoError(t, err)
		return h.Stats.Executions > 0
	})
	h, err := f.client.History(ctx, jetfleet.HistoryRequest{Kind: "resize"})
	require.NoError(t, err)
	recs, err := h.Decode()
	require.NoError(t, err)
	require.Len(t, recs, 1, "progress events are no executions")
	assert.Equal(t, protocol.EventSucceeded, recs[0].GetStatus())
}

// TestJobReportingProgressIsRescued: a job whose latest event is a
// progress report still runs; when its agent dies, the supervisor rescues
// it within seconds (AckWait is 60s) like a job whose latest event is
// started.
func TestJobReportingProgressIsRescued(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	f.leader(t, supervisor.Config{}, nil)
	const id = "long-7"
	reported := make(chan struct{})
	victim := f.startAgent(t, "", agent.Config{ID: "victim"}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			if err := agent.ReportProgress(ctx, 0.25, "a quarter"); err != nil {
				return err
			}
			close(reported)
			<-ctx.Done() // never finishes: the process is killed meanwhile
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	beats := watchHeartbeats(t, f.nc, victim.ID())
	fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "work"})
	<-reported
	fleettest.WaitLatestEvent(t, f.js, id, protocol.EventProgress, 10*time.Second)
	beats.wait(t, 10*time.Second, time.Now(), func(hb *jetfleetpb.Heartbeat) bool {
		return len(hb.GetJobs()) == 1 && hb.GetJobs()[0].GetProgressAt() != nil
	})
	f.startAgent(t, "", agent.Config{ID: "rescuer"}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error { return nil }, agent.KindOptions{}))
	})

	killedAt := time.Now()
	victim.kill()
	ev := f.events.WaitFor(t, 15*time.Second, id, protocol.EventSucceeded)
	assert.Equal(t, "rescuer", ev.GetAgentId())
	assert.Less(t, time.Since(killedAt), 10*time.Second, "rescued, not redelivered after AckWait")
	rescued := f.events.WaitFor(t, time.Second, id, protocol.EventRescued)
	assert.Equal(t, "victim", rescued.GetAgentId())
}

// TestJobWaitingForItsLimitIsRescued: a job that waits for its kind's
// fleet-wide limit keeps its delivery, and its latest event is waiting;
// when its agent dies, the supervisor rescues it within seconds (AckWait
// is 60s) like a running job (docs/protocol.md §2.4).
func TestJobWaitingForItsLimitIsRescued(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	f.leader(t, supervisor.Config{}, nil)
	ctx := fleettest.Ctx(t, time.Minute)
	require.NoError(t, jetfleet.NewClient(f.nc).SetLimit(ctx, "default", "work", jetfleet.KindLimit{Concurrency: 1}))
	started := make(chan struct{}, 1)
	victim := f.startAgent(t, "", agent.Config{ID: "victim"}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			started <- struct{}{}
			<-ctx.Done() // never finishes: the process is killed meanwhile
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	beats := watchHeartbeats(t, f.nc, victim.ID())
	fleettest.Publish(t, f.js, protocol.Job{ID: "holds-the-slot", Queue: "default", Kind: "work"})
	<-started
	const id = "waits-for-it"
	fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "work"})
	fleettest.WaitLatestEvent(t, f.js, id, protocol.EventWaiting, 10*time.Second)
	beats.wait(t, 10*time.Second, time.Now(), func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == 2 })

	killedAt := time.Now()
	victim.kill()
	rescued := f.events.WaitFor(t, 15*time.Second, id, protocol.EventRescued)
	assert.Equal(t, "victim", rescued.GetAgentId())
	assert.Less(t, time.Since(killedAt), 10*time.Second, "rescued, not redelivered after AckWait")
}
