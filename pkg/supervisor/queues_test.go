package supervisor_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestJobsNoQueueServesAreDeadLettered: JOBS accepts a job on any subject
// under jobs.>, but no consumer delivers one on a subject of the wrong
// shape or of a queue without a consumer. The status counts them, and the
// leader dead-letters each, with its reason, once it has waited
// unroutable_after; a job whose queue appears in time (an agent starts)
// runs instead.
func TestJobsNoQueueServesAreDeadLettered(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 60*time.Second)
	publish := func(subject string, id string) {
		_, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte(`{}`),
			Header: nats.Header{protocol.HeaderJobID: {id}}})
		require.NoError(t, err, "JOBS accepts %s", subject)
	}
	long := strings.Repeat("q", 200)
	publish("jobs.default", "two-tokens")
	publish("jobs."+long+".x", "long-token")
	publish("jobs.nosuchqueue.echo", "no-queue")
	publish("jobs.later.echo.urgent", "no-such-priority")
	publish("jobs.later.echo", "queue-appears")

	f.leader(t, fast(supervisor.Config{UnroutableAfter: 2 * time.Second}), nil)
	status, err := f.client.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), status.Unroutable, "the status counts the jobs no queue serves")
	f.startAgent(t, "", agent.Config{Queues: []string{"later"}}, func(a *agent.Agent) {
		must(t, a.Register("echo", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})

	want := map[string]string{"two-tokens": protocol.ReasonInvalidSubject, "long-token": protocol.ReasonInvalidSubject,
		"no-queue": protocol.ReasonUnroutable, "no-such-priority": protocol.ReasonInvalidSubject}
	for id, reason := range want {
		dead := f.events.WaitFor(t, 15*time.Second, id, protocol.EventDead)
		assert.Equal(t, reason, dead.GetReason(), id)
	}
	f.events.WaitFor(t, 15*time.Second, "queue-appears", protocol.EventSucceeded)
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 4)
	for _, dl := range letters {
		assert.Equal(t, want[dl.GetJobId()], dl.GetReason(), dl.GetJobId())
		assert.NotEmpty(t, dl.GetLastError())
		assert.Equal(t, []byte(`{}`), dl.GetPayload(), "the dead letter keeps the payload")
	}
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second) // each removed once its dead event is stored
	status, err = f.client.Status(ctx)
	require.NoError(t, err)
	assert.Zero(t, status.Unroutable)
}

// TestQueueAddListRemove: jetfleet queue add creates a queue with its
// settings, which an agent serving it keeps; ls lists it; rm refuses a
// queue holding jobs, and with force removes it, its jobs then
// dead-lettered as unroutable. A queue declared in the configuration
// exists from the supervisor's start and cannot be removed.
func TestQueueAddListRemove(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"declared": {AckWait: 2 * time.Minute}}})
	f.leader(t, fast(supervisor.Config{UnroutableAfter: 500 * time.Millisecond}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)

	list, err := f.client.Queues(ctx)
	require.NoError(t, err)
	require.Len(t, list.Queues, 1, "the declared queue exists from the start")
	assert.Equal(t, "declared", list.Queues[0].Queue)
	assert.True(t, list.Queues[0].Declared)
	assert.Equal(t, 2*time.Minute, list.Queues[0].AckWait)

	added, err := f.client.AddQueue(ctx, jetfleet.QueueAddRequest{Queue: "reports", AckWait: 5 * time.Minute, MaxDeliver: 7})
	require.NoError(t, err)
	assert.True(t, added.Created)
	assert.Equal(t, 5*time.Minute, added.Queue.AckWait)
	again, err := f.client.AddQueue(ctx, jetfleet.QueueAddRequest{Queue: "reports"})
	require.NoError(t, err)
	assert.False(t, again.Created)
	assert.Equal(t, 5*time.Minute, again.Queue.AckWait, "an add without settings keeps the queue's")

	// An agent serving the queue keeps its settings.
	release := make(chan struct{})
	f.startAgent(t, "", agent.Config{Queues: []string{"reports"}, Concurrency: 1}, func(a *agent.Agent) {
		must(t, a.Register("render", func(context.Context, *agent.Job) error { <-release; return nil }, agent.KindOptions{}))
	})
	t.Cleanup(func() { close(release) })
	fleettest.Publish(t, f.js, protocol.Job{ID: "r-1", Queue: "reports", Kind: "render"})
	fleettest.Publish(t, f.js, protocol.Job{ID: "r-2", Queue: "reports", Kind: "render"})
	list, err = f.client.Queues(ctx)
	require.NoError(t, err)
	require.Len(t, list.Queues, 2)
	assert.Equal(t, 5*time.Minute, list.Queues[1].AckWait)
	assert.Equal(t, 7, list.Queues[1].MaxDeliver)

	_, err = f.client.RemoveQueue(ctx, jetfleet.QueueRemoveRequest{Queue: "reports"})
	require.ErrorIs(t, err, protocol.Code(protocol.CodeConflict), "a queue holding jobs is not removed")
	_, err = f.client.RemoveQueue(ctx, jetfleet.QueueRemoveRequest{Queue: "declared"})
	require.ErrorIs(t, err, protocol.Code(protocol.CodeConflict), "a declared queue is not removed")
	_, err = f.client.RemoveQueue(ctx, jetfleet.QueueRemoveRequest{Queue: "nothing"})
	require.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
	_, err = f.client.AddQueue(ctx, jetfleet.QueueAddRequest{Queue: "bad queue"})
	var pe *protocol.Error
	require.True(t, errors.As(err, &pe), "%v", err)
	assert.Equal(t, "queue", pe.Field)

	removed, err := f.client.RemoveQueue(ctx, jetfleet.QueueRemoveRequest{Queue: "reports", Force: true})
	require.NoError(t, err)
	assert.Equal(t, uint64(2), removed.Jobs)
	// r-2 waited in the queue: now no consumer serves it.
	dead := f.events.WaitFor(t, 15*time.Second, "r-2", protocol.EventDead)
	assert.Equal(t, protocol.ReasonUnroutable, dead.GetReason())
}
