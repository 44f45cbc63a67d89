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

// report are the args of the unique jobs of these tests.
type report struct {
	Customer string `json:"customer"`
}

func (report) Kind() string { return "report" }

// released waits until the leader released jobID's unique key.
func (f *fixture) released(t *testing.T, jobID string) {
	t.Helper()
	f.logs.Wait(t, 15*time.Second, "unique key of "+jobID+" released",
		fleettest.MatchLog("released a unique key", "job_id", jobID))
}

// enqueueUnique enqueues a report whose key is held until it finished.
func (f *fixture) enqueueUnique(t *testing.T, ctx context.Context, opts ...jetfleet.EnqueueOption) *jetfleet.EnqueueResult {
	t.Helper()
	res, err := f.client.Enqueue(ctx, report{Customer: "acme"}, append([]jetfleet.EnqueueOption{jetfleet.WithUniqueUntilFinished("acme")}, opts...)...)
	require.NoError(t, err)
	return res
}

// blockingAgent runs reports, each until it receives from release (or its
// context ends).
func (f *fixture) blockingAgent(t *testing.T, id string, release <-chan struct{}, started chan<- string) *testAgent {
	return f.startAgent(t, "", agent.Config{ID: id, HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("report", func(ctx context.Context, job *agent.Job) error {
			started <- job.ID
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}, agent.KindOptions{Timeout: time.Minute}))
	})
}

// TestUniqueUntilFinishedReleasedOnSuccess: while a job holds its key
// until it finished, another Enqueue of the key returns it and stores
// nothing; once it succeeded, the leader releases the key and the next
// Enqueue stores a new job.
func TestUniqueUntilFinishedReleasedOnSuccess(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	release, started := make(chan struct{}), make(chan string, 4)
	f.blockingAgent(t, "unique-1", release, started)

	first := f.enqueueUnique(t, ctx)
	assert.False(t, first.Duplicate)
	assert.Equal(t, first.JobID, <-started)
	again := f.enqueueUnique(t, ctx)
	assert.True(t, again.Duplicate, "the key is held while the job runs")
	assert.Equal(t, first.JobID, again.JobID, "a duplicate returns the job that holds the key")
	assert.Zero(t, again.Sequence)

	release <- struct{}{}
	f.events.WaitFor(t, 10*time.Second, first.JobID, protocol.EventSucceeded)
	f.released(t, first.JobID)
	next := f.enqueueUnique(t, ctx)
	assert.False(t, next.Duplicate, "released when the job succeeded")
	assert.NotEqual(t, first.JobID, next.JobID)
	assert.Equal(t, next.JobID, <-started)
}

// TestUniqueReleasedOnDeadLetter: a job that is dead-lettered releases its
// key, held until finished or for a period alike, so a failure never
// blocks the jobs after it (asynq's archived task that keeps its lock).
func TestUniqueReleasedOnDeadLetter(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("report", func(context.Context, *agent.Job) error { return errors.New("the printer is on fire") },
			agent.KindOptions{}))
	})
	for _, opt := range []jetfleet.EnqueueOption{
		jetfleet.WithUniqueUntilFinished("acme"),
		jetfleet.WithUniqueFor("acme-daily", time.Hour),
	} {
		first, err := f.client.Enqueue(ctx, report{Customer: "acme"}, opt, jetfleet.WithMaxAttempts(1))
		require.NoError(t, err)
		require.False(t, first.Duplicate)
		f.events.WaitFor(t, 10*time.Second, first.JobID, protocol.EventDead)
		f.released(t, first.JobID)
		next, err := f.client.Enqueue(ctx, report{Customer: "acme"}, opt, jetfleet.WithMaxAttempts(1))
		require.NoError(t, err)
		assert.False(t, next.Duplicate, "released when the job was dead-lettered")
		f.events.WaitFor(t, 10*time.Second, next.JobID, protocol.EventDead)
	}
}

// TestUniqueReleasedOnCancel: a queued job cancelled releases its key.
func TestUniqueReleasedOnCancel(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)

	// Queue idle has no agent: the job waits there.
	first := f.enqueueUnique(t, ctx, jetfleet.WithQueue("idle"))
	again := f.enqueueUnique(t, ctx, jetfleet.WithQueue("idle"))
	require.True(t, again.Duplicate)
	res, err := f.client.Cancel(ctx, first.JobID)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.CancelQueued, res.Where)
	f.released(t, first.JobID)
	next := f.enqueueUnique(t, ctx, jetfleet.WithQueue("idle"))
	assert.False(t, next.Duplicate, "released when the job was cancelled")
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 1, 10*time.Second)
}

// TestUniquePeriodOutlivesSuccess: a key held for a period stays held
// after its job succeeded (at most one job per period), but the job's
// hold is dropped.
func TestUniquePeriodOutlivesSuccess(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("report", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})
	first, err := f.client.Enqueue(ctx, report{}, jetfleet.WithUniqueFor("acme-daily", time.Hour))
	require.NoError(t, err)
	f.events.WaitFor(t, 10*time.Second, first.JobID, protocol.EventSucceeded)
	kv, err := f.js.KeyValue(ctx, protocol.BucketUnique)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, protocol.UniqueJobKey(first.JobID))
		return err != nil
	}, 10*time.Second, 20*time.Millisecond, "the job's hold is dropped when its run is over")
	again, err := f.client.Enqueue(ctx, report{}, jetfleet.WithUniqueFor("acme-daily", time.Hour))
	require.NoError(t, err)
	assert.True(t, again.Duplicate, "a success keeps a period key")
	assert.Equal(t, first.JobID, again.JobID)
	assert.Zero(t, f.logs.Count(fleettest.MatchLog("released a unique key", "job_id", first.JobID)))
}

// TestUniqueAcrossFailover: uniqueness holds while the supervisor leader
// changes, and a key held until finished whose job ends while no replica
// leads is released by the next leader.
func TestUniqueAcrossFailover(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	cfg := fast(supervisor.Config{})
	s1, stop1 := f.startSupervisor(t, cfg, nil)
	s2, stop2 := f.startSupervisor(t, cfg, nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	waitFor(t, 20*time.Second, "a leader", func() bool { return s1.IsLeader() || s2.IsLeader() })
	follower, stopLeader := s2, stop1
	if s2.IsLeader() {
		follower, stopLeader = s1, stop2
	}
	release, started := make(chan struct{}), make(chan string, 4)
	f.blockingAgent(t, "unique-ha", release, started)
	first := f.enqueueUnique(t, ctx)
	require.Equal(t, first.JobID, <-started)

	stopLeader()
	again := f.enqueueUnique(t, ctx)
	assert.True(t, again.Duplicate, "held while the leader is gone")
	assert.Equal(t, first.JobID, again.JobID)
	release <- struct{}{} // the job ends, maybe before the follower leads
	f.events.WaitFor(t, 10*time.Second, first.JobID, protocol.EventSucceeded)
	require.NoError(t, follower.WaitLeading(ctx, true))
	f.released(t, first.JobID)
	next := f.enqueueUnique(t, ctx)
	assert.False(t, next.Duplicate, "the new leader released the key")
	assert.Equal(t, 1, f.logs.Count(fleettest.MatchLog("released a unique key", "job_id", first.JobID)), "released once")
	assert.Equal(t, next.JobID, <-started)
	again = f.enqueueUnique(t, ctx)
	assert.True(t, again.Duplicate, "the new job holds the key under the new leader")
	assert.Equal(t, next.JobID, again.JobID)
}

// TestUniqueKeysOfABurstAreAllReleased: the holds of a burst of jobs, some
// unique and some not, are read in batches; every unique key is released
// once its job succeeded, and a new job of each key is stored after.
func TestUniqueKeysOfABurstAreAllReleased(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	f.startAgent(t, "", agent.Config{ID: "burst-1", Concurrency: 32}, func(a *agent.Agent) {
		must(t, a.Register("report", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})
	const n = 60
	unique := make([]string, 0, n)
	for i := range n {
		customer := fmt.Sprintf("customer-%d", i)
		res, err := f.client.Enqueue(ctx, report{Customer: customer}, jetfleet.WithUniqueUntilFinished(customer))
		require.NoError(t, err)
		require.False(t, res.Duplicate)
		unique = append(unique, res.JobID)
		_, err = f.client.Enqueue(ctx, report{Customer: customer})
		require.NoError(t, err)
	}
	for _, id := range unique {
		f.released(t, id)
	}
	for i := range n {
		customer := fmt.Sprintf("customer-%d", i)
		res, err := f.client.Enqueue(ctx, report{Customer: customer}, jetfleet.WithUniqueUntilFinished(customer))
		require.NoError(t, err)
		assert.False(t, res.Duplicate, "key %s was released", customer)
	}
}
