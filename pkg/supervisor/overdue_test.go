package supervisor_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestOverdueJobIsCancelledThenFailed: a handler that ignores its context
// runs past its deadline. The supervisor sends the cancel command after
// deadline_grace, and kill_grace later fails the attempt itself: timed_out,
// then a NAK, and the next attempt runs (and succeeds); or, for a kind
// whose timeout_action is dead_letter, a dead letter with reason timed_out.
func TestOverdueJobIsCancelledThenFailed(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	f.leader(t, fast(supervisor.Config{DeadlineGrace: 200 * time.Millisecond, KillGrace: 500 * time.Millisecond,
		Escalation: supervisor.EscalationConfig{Kinds: map[string]supervisor.EscalationPolicy{
			"stuck-dl": {TimeoutAction: supervisor.TimeoutActionDeadLetter}}}}), nil)
	release := make(chan struct{})
	defer close(release)
	var cancelled atomic.Int32
	stuck := func(ctx context.Context, job *agent.Job) error {
		if job.Attempt > 1 {
			return nil
		}
		<-ctx.Done() // the deadline, then the supervisor's cancel command
		cancelled.Add(1)
		<-release // but it ignores both
		return ctx.Err()
	}
	f.startAgent(t, "", agent.Config{ID: "sticky", Concurrency: 4, HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("stuck", stuck, agent.KindOptions{}))
		must(t, a.Register("stuck-dl", stuck, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "late-1", Queue: "default", Kind: "stuck", Timeout: 300 * time.Millisecond})
	fleettest.Publish(t, f.js, protocol.Job{ID: "late-2", Queue: "default", Kind: "stuck-dl", Timeout: 300 * time.Millisecond})

	timedOut := f.events.WaitFor(t, 10*time.Second, "late-1", protocol.EventTimedOut)
	assert.Equal(t, "sticky", timedOut.GetAgentId())
	assert.Equal(t, protocol.CodeTimeout, timedOut.GetErrorCode())
	assert.Equal(t, uint32(1), timedOut.GetAttempt())
	ok := f.events.WaitFor(t, 10*time.Second, "late-1", protocol.EventSucceeded)
	assert.Equal(t, uint32(2), ok.GetAttempt(), "the failed attempt counts")

	f.events.WaitFor(t, 10*time.Second, "late-2", protocol.EventTimedOut)
	dead := f.events.WaitFor(t, 10*time.Second, "late-2", protocol.EventDead)
	assert.Equal(t, protocol.ReasonTimedOut, dead.GetReason())
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	assert.Equal(t, "late-2", letters[0].GetJobId())
	assert.Equal(t, protocol.ReasonTimedOut, letters[0].GetReason())

	jobs, err := f.client.RunningJobs(fleettest.Ctx(t, 5*time.Second), jetfleet.RunningJobsRequest{AgentID: "sticky"})
	require.NoError(t, err)
	states := map[string]string{} // by delivery: a heartbeat may still list late-1's second one
	for _, j := range jobs.Jobs {
		states[fmt.Sprintf("%s/%d", j.JobID, j.Delivered)] = j.State
	}
	assert.Equal(t, "timed_out", states["late-1/1"], "the agent still holds it: %v", states)
	assert.Equal(t, "timed_out", states["late-2/1"], "the agent still holds it: %v", states)
	assert.Equal(t, int32(2), cancelled.Load())
}

// skewed is a clock off by a fixed offset: another host's clock.
type skewed struct {
	clock.Clock
	off time.Duration
}

func (s skewed) Now() time.Time { return s.Clock.Now().Add(s.off) }

// TestSkewedSupervisorClock runs the supervisor on a host whose clock is 90s
// off the agents'. Deadlines are durations measured on the supervisor's
// clock, and attempt outcomes count when the supervisor receives them, so
// the skew changes nothing: ahead, a healthy job well inside its timeout
// is left alone; behind, a stuck job is still timed out; a burst of
// failures still opens the breaker, for the cool-down the server is told.
func TestSkewedSupervisorClock(t *testing.T) {
	t.Parallel()
	topo := topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}}
	t.Run("ahead, healthy job", func(t *testing.T) {
		t.Parallel()
		f := setup(t, topo)
		f.leader(t, fast(supervisor.Config{DeadlineGrace: 200 * time.Millisecond, KillGrace: 500 * time.Millisecond}),
			skewed{clock.Real(), 90 * time.Second})
		f.startAgent(t, "", agent.Config{ID: "honest", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
			must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
				select {
				case <-time.After(1500 * time.Millisecond): // ten checks of deadline and grace
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, agent.KindOptions{}))
		})
		fleettest.Publish(t, f.js, protocol.Job{ID: "healthy-1", Queue: "default", Kind: "work", Timeout: 30 * time.Second})
		ok := f.events.WaitFor(t, 10*time.Second, "healthy-1", protocol.EventSucceeded)
		assert.Equal(t, uint32(1), ok.GetAttempt())
		for _, typ := range []string{protocol.EventCancelled, protocol.EventTimedOut, protocol.EventDead, protocol.EventRetrying} {
			assert.Zero(t, countEvents(f.events, "healthy-1", typ), typ)
		}
		assert.Zero(t, f.logs.Count(fleettest.MatchLog("told the agent to time out an overdue job")))
		assert.Zero(t, f.logs.Count(fleettest.MatchLog("the agent does not know the timeout command; the attempt is failed after kill_grace")))
		assert.Empty(t, fleettest.DeadLetters(t, f.js))
	})
	t.Run("behind, stuck job", func(t *testing.T) {
		t.Parallel()
		f := setup(t, topo)
		f.leader(t, fast(supervisor.Config{DeadlineGrace: 200 * time.Millisecond, KillGrace: 500 * time.Millisecond}),
			skewed{clock.Real(), -90 * time.Second})
		release := make(chan struct{})
		defer close(release)
		f.startAgent(t, "", agent.Config{ID: "sticky", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
			must(t, a.Register("stuck", func(ctx context.Context, job *agent.Job) error {
				if job.Attempt > 1 {
					return nil
				}
				<-release // ignores its context
				return ctx.Err()
			}, agent.KindOptions{}))
		})
		fleettest.Publish(t, f.js, protocol.Job{ID: "late-1", Queue: "default", Kind: "stuck", Timeout: 300 * time.Millisecond})
		timedOut := f.events.WaitFor(t, 10*time.Second, "late-1", protocol.EventTimedOut)
		assert.Equal(t, uint32(1), timedOut.GetAttempt())
		ok := f.events.WaitFor(t, 10*time.Second, "late-1", protocol.EventSucceeded)
		assert.Equal(t, uint32(2), ok.GetAttempt())
	})
	t.Run("ahead, breaker", func(t *testing.T) {
		t.Parallel()
		f := setup(t, topology.Config{})
		queueEvents := subscribe(t, f.nc, protocol.QueueEventsSubjects)
		const coolDown = 10 * time.Second
		f.leader(t, fast(supervisor.Config{Breaker: supervisor.BreakerConfig{Default: supervisor.BreakerPolicy{
			FailureRate: 0.5, Window: time.Minute, MinSamples: 4, CoolDown: coolDown}}}), skewed{clock.Real(), 90 * time.Second})
		f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
			must(t, a.Register("fragile", func(context.Context, *agent.Job) error {
				return agent.Retry(errors.New("downstream 503"), time.Hour)
			}, agent.KindOptions{}))
		})
		for _, id := range []string{"x-1", "x-2", "x-3", "x-4"} {
			fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "fragile"})
		}
		m := queueEvents.next(t, 15*time.Second)
		assert.Equal(t, protocol.QueueEventSubject("default", protocol.EventBreakerOpened), m.Subject)
		ctx := fleettest.Ctx(t, 10*time.Second)
		cons, err := f.js.Consumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default"))
		require.NoError(t, err)
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		assert.True(t, info.Paused)
		assert.LessOrEqual(t, info.PauseRemaining, coolDown, "the server pauses for the cool-down, not the clocks' difference")
	})
}

// TestOverdueAttemptEndsAsTimeout: the supervisor's command for an attempt
// past its timeout is not a cancel (an agent dead-letters a cancelled job
// with reason cancelled). The handler, ending only after the command was
// answered, fails as a timeout: retried, and the next attempt succeeds.
func TestOverdueAttemptEndsAsTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	// A long kill_grace: the agent's own verdict decides.
	f.leader(t, fast(supervisor.Config{DeadlineGrace: 200 * time.Millisecond, KillGrace: time.Minute}), nil)
	answered := make(chan struct{})
	go func() {
		ctx := fleettest.Ctx(t, 20*time.Second)
		if _, ok := f.logs.Await(ctx, func(r fleettest.LogRecord) bool {
			return r.Attrs["job_id"] == "slow-1" && r.Msg == "told the agent to time out an overdue job"
		}); ok {
			close(answered)
		}
	}()
	f.startAgent(t, "", agent.Config{ID: "slow", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("slow", func(ctx context.Context, job *agent.Job) error {
			if job.Attempt > 1 {
				return nil
			}
			<-ctx.Done() // the deadline
			select {     // ends once the supervisor's command was handled
			case <-answered:
			case <-time.After(20 * time.Second):
			}
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "slow-1", Queue: "default", Kind: "slow", Timeout: 300 * time.Millisecond})
	ok := f.events.WaitFor(t, 20*time.Second, "slow-1", protocol.EventSucceeded)
	assert.Equal(t, uint32(2), ok.GetAttempt())
	retry := f.events.WaitFor(t, time.Second, "slow-1", protocol.EventRetrying)
	assert.Equal(t, protocol.CodeTimeout, retry.GetErrorCode())
	assert.Zero(t, countEvents(f.events, "slow-1", protocol.EventCancelled))
	assert.Zero(t, countEvents(f.events, "slow-1", protocol.EventTimedOut), "the agent settled it within kill_grace")
	assert.Empty(t, fleettest.DeadLetters(t, f.js))
}

// TestTimedOutDeadLetterIsRetriedUntilStored: timeout_action dead_letter,
// and the DLQ stream accepts nothing for a while after the timed_out event
// was stored. The supervisor keeps trying — its own timed_out event is no
// sign the attempt ended — and once the DLQ is back the job is
// dead-lettered exactly once and leaves JOBS.
func TestTimedOutDeadLetterIsRetriedUntilStored(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	f.leader(t, fast(supervisor.Config{DeadlineGrace: 200 * time.Millisecond, KillGrace: 500 * time.Millisecond,
		Escalation: supervisor.EscalationConfig{Kinds: map[string]supervisor.EscalationPolicy{
			"stuck-dl": {TimeoutAction: supervisor.TimeoutActionDeadLetter}}}}), nil)
	release := make(chan struct{})
	defer close(release)
	f.startAgent(t, "", agent.Config{ID: "sticky", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("stuck-dl", func(ctx context.Context, job *agent.Job) error {
			<-release // ignores its context
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	ctx := fleettest.Ctx(t, 30*time.Second)
	dlq, err := f.js.Stream(ctx, protocol.StreamDLQ)
	require.NoError(t, err)
	info, err := dlq.Info(ctx)
	require.NoError(t, err)
	off := info.Config
	off.Subjects = []string{"dlq-unavailable.>"} // dead letters find no stream
	_, err = f.js.UpdateStream(ctx, off)
	require.NoError(t, err)

	// Running past 1s, the attempt has its started event before it times out.
	fleettest.Publish(t, f.js, protocol.Job{ID: "late-dl", Queue: "default", Kind: "stuck-dl", Timeout: 1500 * time.Millisecond})
	f.events.WaitFor(t, 10*time.Second, "late-dl", protocol.EventTimedOut)
	retry := fleettest.MatchLog("dead letter of a timed-out job failed; retrying", "job_id", "late-dl")
	f.logs.Wait(t, 10*time.Second, "of a failed dead letter", retry)
	waitFor(t, 10*time.Second, "a second try", func() bool { return f.logs.Count(retry) >= 2 })
	_, err = f.js.UpdateStream(ctx, info.Config) // the DLQ is back
	require.NoError(t, err)

	dead := f.events.WaitFor(t, 10*time.Second, "late-dl", protocol.EventDead)
	assert.Equal(t, protocol.ReasonTimedOut, dead.GetReason())
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	assert.Equal(t, "late-dl", letters[0].GetJobId())
	assert.Equal(t, protocol.ReasonTimedOut, letters[0].GetReason())
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
	assert.Equal(t, 1, countEvents(f.events, "late-dl", protocol.EventTimedOut), "one timed_out event")
	assert.Equal(t, 1, countEvents(f.events, "late-dl", protocol.EventDead))
}
