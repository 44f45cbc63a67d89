package supervisor_test

import (
	"context"
	"errors"
	"fmt"
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

// TestCancelEndsAJobWhereverItIs: a cancel ends a queued job (removed, no
// agent ever runs it), one waiting for its retry, and a running one (its
// handler's context is cancelled, its error naming the cancel): each run
// ends with the event cancelled, no dead letter, no message left in JOBS.
func TestCancelEndsAJobWhereverItIs(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)

	// Queued: no agent serves queue idle.
	fleettest.Publish(t, f.js, protocol.Job{ID: "queued-1", Queue: "idle", Kind: "work"})
	res, err := f.client.Cancel(ctx, "queued-1", jetfleet.CancelReason("not needed"), jetfleet.CancelRequestedBy("ops"))
	require.NoError(t, err)
	assert.Equal(t, jetfleet.CancelResult{JobID: "queued-1", Where: jetfleet.CancelQueued}, *res)
	ev := fleettest.LatestEvent(t, f.js, "queued-1")
	require.NotNil(t, ev)
	assert.Equal(t, protocol.EventCancelled, ev.GetType())
	assert.Equal(t, "cancelled by ops: not needed", ev.GetError())
	assert.Equal(t, protocol.CodeCancelled, ev.GetErrorCode())

	// Retrying and running: an agent fails "flaky" once with a long
	// backoff, and runs "slow" until cancelled.
	started := make(chan struct{}, 1)
	causes := make(chan error, 1)
	f.startAgent(t, "", agent.Config{Queues: []string{"default"}}, func(a *agent.Agent) {
		must(t, a.Register("flaky", func(context.Context, *agent.Job) error { return errors.New("try again later") },
			agent.KindOptions{}))
		must(t, a.Register("slow", func(ctx context.Context, _ *agent.Job) error {
			started <- struct{}{}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return ctx.Err()
		}, agent.KindOptions{Timeout: time.Minute}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "retrying-1", Queue: "default", Kind: "flaky", MaxAttempts: 5,
		Backoff: []time.Duration{time.Hour}})
	f.events.WaitFor(t, 10*time.Second, "retrying-1", protocol.EventRetrying)
	res, err = f.client.Cancel(ctx, "retrying-1")
	require.NoError(t, err)
	assert.Equal(t, jetfleet.CancelRetrying, res.Where)

	fleettest.Publish(t, f.js, protocol.Job{ID: "running-1", Queue: "default", Kind: "slow"})
	<-started
	f.events.WaitFor(t, 10*time.Second, "running-1", protocol.EventStarted)
	res, err = f.client.Cancel(ctx, "running-1", jetfleet.CancelReason("wrong input"))
	require.NoError(t, err)
	assert.Equal(t, jetfleet.CancelRunning, res.Where)
	assert.NotEmpty(t, res.AgentID)
	cause := <-causes
	assert.ErrorContains(t, cause, "wrong input", "the handler learns why")
	ev = f.events.WaitFor(t, 10*time.Second, "running-1", protocol.EventCancelled)
	assert.Contains(t, ev.GetError(), "wrong input")

	for _, id := range []string{"queued-1", "retrying-1", "running-1"} {
		assert.Equal(t, protocol.EventCancelled, fleettest.WaitLatestEvent(t, f.js, id, protocol.EventCancelled, 10*time.Second).GetType(), id)
	}
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
	assert.Empty(t, fleettest.DeadLetters(t, f.js), "a cancelled job is no dead letter")

	// A job whose run is over cannot be cancelled.
	_, err = f.client.Cancel(ctx, "running-1")
	assert.True(t, protocol.IsCode(err, protocol.CodeConflict), "%v", err)
}

// TestCancelWithDeadLetter: a cancel asking for a dead letter moves the job
// to the DLQ with reason cancelled, where it can be replayed.
func TestCancelWithDeadLetter(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 30*time.Second)
	fleettest.Publish(t, f.js, protocol.Job{ID: "to-dlq", Queue: "idle", Kind: "work", Payload: []byte(`{"n":1}`)})
	res, err := f.client.Cancel(ctx, "to-dlq", jetfleet.CancelWithDeadLetter(), jetfleet.CancelReason("bad batch"))
	require.NoError(t, err)
	assert.Equal(t, jetfleet.CancelQueued, res.Where)
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	assert.Equal(t, protocol.ReasonCancelled, letters[0].GetReason())
	assert.Equal(t, protocol.CodeCancelled, letters[0].GetErrorCode())
	assert.Contains(t, letters[0].GetLastError(), "bad batch")
	assert.Equal(t, []byte(`{"n":1}`), letters[0].GetPayload())
	assert.Equal(t, protocol.EventDead, fleettest.LatestEvent(t, f.js, "to-dlq").GetType())
	assert.Zero(t, fleettest.StreamMsgs(t, f.js, protocol.StreamJobs))
}

// TestCancelByFilter: a filtered cancel ends the queued jobs of one kind,
// or of one schedule, and no other; Limit bounds it and says it was
// truncated.
func TestCancelByFilter(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 30*time.Second)
	for i := range 5 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("a-%d", i), Queue: "idle", Kind: "a"})
	}
	for i := range 3 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("b-%d", i), Queue: "idle", Kind: "b"})
	}
	fleettest.Publish(t, f.js, protocol.Job{ID: "nightly-1", Queue: "idle", Kind: "b", ScheduleID: "nightly"})

	res, err := f.client.CancelJobs(ctx, jetfleet.CancelRequest{Kind: "a", Limit: 2})
	require.NoError(t, err)
	assert.True(t, res.Truncated)
	assert.Equal(t, []jetfleet.CancelResult{{JobID: "a-0", Where: jetfleet.CancelQueued}, {JobID: "a-1", Where: jetfleet.CancelQueued}},
		res.Results, "oldest first")

	res, err = f.client.CancelJobs(ctx, jetfleet.CancelRequest{Queue: "idle", Kind: "a"})
	require.NoError(t, err)
	assert.False(t, res.Truncated)
	assert.Len(t, res.Results, 3)

	res, err = f.client.CancelJobs(ctx, jetfleet.CancelRequest{ScheduleID: "nightly"})
	require.NoError(t, err)
	require.Len(t, res.Results, 1)
	assert.Equal(t, "nightly-1", res.Results[0].JobID)

	assert.Equal(t, uint64(3), fleettest.StreamMsgs(t, f.js, protocol.StreamJobs), "the jobs of kind b are left")
	for i := range 3 {
		assert.Empty(t, f.events.Of(fmt.Sprintf("b-%d", i)))
	}
}

// TestCancelPendingEndsTheJobWhenDelivered: a cancel of a job the
// supervisor does not find (here: one narrowed to the wrong kind) is
// recorded; the agent that receives the job ends it as cancelled without
// running it. A job enqueued after the cancel with the same id is another
// job, and runs.
func TestCancelPendingEndsTheJobWhenDelivered(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 30*time.Second)
	fleettest.Publish(t, f.js, protocol.Job{ID: "far-back", Queue: "default", Kind: "work"})
	res, err := f.client.CancelJobs(ctx, jetfleet.CancelRequest{JobID: "far-back", Queue: "default", Kind: "other"})
	require.NoError(t, err)
	assert.Equal(t, jetfleet.CancelPending, res.Results[0].Where)
	res, err = f.client.CancelJobs(ctx, jetfleet.CancelRequest{JobID: "enqueued-later"})
	require.NoError(t, err)
	assert.Equal(t, jetfleet.CancelPending, res.Results[0].Where, "an unknown id cannot be told from a job far back in its queue")
	fleettest.Publish(t, f.js, protocol.Job{ID: "enqueued-later", Queue: "default", Kind: "work"})

	ran := make(chan string, 2)
	f.startAgent(t, "", agent.Config{Queues: []string{"default"}}, func(a *agent.Agent) {
		must(t, a.Register("work", func(_ context.Context, j *agent.Job) error {
			ran <- j.ID
			return nil
		}, agent.KindOptions{}))
	})
	ev := f.events.WaitFor(t, 10*time.Second, "far-back", protocol.EventCancelled)
	assert.Equal(t, protocol.CodeCancelled, ev.GetErrorCode())
	f.events.WaitFor(t, 10*time.Second, "enqueued-later", protocol.EventSucceeded)
	assert.Equal(t, "enqueued-later", <-ran)
	assert.Empty(t, ran, "the cancelled job never ran")
	assert.NotContains(t, f.events.Of("far-back"), protocol.EventStarted)
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
}

// TestCancelRefusesBadRequests names the field at fault.
func TestCancelRefusesBadRequests(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 30*time.Second)
	for _, tc := range []struct {
		req   jetfleet.CancelRequest
		field string
	}{
		{jetfleet.CancelRequest{}, "job_id"},
		{jetfleet.CancelRequest{JobID: "has space"}, "job_id"},
		{jetfleet.CancelRequest{Kind: "a.b"}, "kind"},
		{jetfleet.CancelRequest{Queue: "q", Limit: 10_001}, "limit"},
		{jetfleet.CancelRequest{JobID: "x", ScheduleID: "s"}, "schedule_id"},
	} {
		_, err := f.client.CancelJobs(ctx, tc.req)
		var apiErr *protocol.Error
		require.ErrorAs(t, err, &apiErr, "%+v", tc.req)
		assert.Equal(t, protocol.CodeInvalidArgument, apiErr.Code, "%+v", tc.req)
		assert.Equal(t, tc.field, apiErr.Field, "%+v", tc.req)
	}
}
