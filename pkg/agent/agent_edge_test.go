package agent_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// register puts a fresh registration for a (fake) live agent in the agents
// bucket. Its heartbeat interval is long, so it stays live however slowly
// the test's agent starts.
func register(t *testing.T, f *fixture, hb *jetfleetpb.Heartbeat) {
	t.Helper()
	hb.SentAt, hb.Interval = timestamppb.Now(), durationpb.New(20*time.Second)
	data, err := protocol.Marshal(hb)
	require.NoError(t, err)
	kv, err := f.js.KeyValue(fleettest.Ctx(t, 5*time.Second), protocol.BucketAgents)
	require.NoError(t, err)
	_, err = kv.Put(fleettest.Ctx(t, 5*time.Second), hb.GetAgentId(), data)
	require.NoError(t, err)
}

func TestKindRunByAnotherLiveAgentIsPassedOn(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	register(t, f, &jetfleetpb.Heartbeat{AgentId: "resizer", Queues: []string{"default"}, Kinds: []string{"resize"}})
	// Waiting before the agent starts, the job is its first delivery: the
	// agent must already know who is live when it pulls.
	fleettest.Publish(t, f.js, protocol.Job{ID: "r-1", Queue: "default", Kind: "resize"})
	f.startAgent(t, agent.Config{ID: "mailer"}, func(a *agent.Agent) {
		must(t, a.Register("send-email", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})
	released := f.events.WaitFor(t, 10*time.Second, "r-1", protocol.EventReleased)
	assert.Equal(t, "mailer", released.GetAgentId())
	assert.Contains(t, released.GetReason(), "run by agent resizer")
	assert.Equal(t, uint32(1), released.GetSnoozes(), "passing on spends no attempt")

	var attempt atomic.Int32
	f.startAgent(t, agent.Config{ID: "resizer"}, func(a *agent.Agent) {
		must(t, a.Register("resize", func(_ context.Context, job *agent.Job) error {
			attempt.Store(int32(job.Attempt))
			return nil
		}, agent.KindOptions{}))
	})
	f.events.Wait(t, 10*time.Second, func(ev *jetfleetpb.JobEvent) bool {
		return ev.GetJobId() == "r-1" && ev.GetType() == protocol.EventSucceeded && ev.GetAgentId() == "resizer"
	})
	assert.Equal(t, int32(1), attempt.Load())
}

func TestDeliveryBeyondMaxAttemptsIsDeadLetteredWithoutRunning(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 20*time.Second)
	fleettest.Publish(t, f.js, protocol.Job{ID: "lost-1", Queue: "default", Kind: "echo", MaxAttempts: 1})
	cons, err := topology.EnsureQueue(ctx, f.js, topology.Config{}, "default")
	require.NoError(t, err)
	// The first attempt's agent died without answering: the delivery is spent.
	batch, err := cons.Fetch(1)
	require.NoError(t, err)
	msg := <-batch.Messages()
	require.NotNil(t, msg)
	require.NoError(t, msg.Nak())

	var runs atomic.Int32
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("echo", func(context.Context, *agent.Job) error {
			runs.Add(1)
			return nil
		}, agent.KindOptions{}))
	})
	dead := f.events.WaitFor(t, 10*time.Second, "lost-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonMaxAttempts, dead.GetReason())
	assert.Equal(t, protocol.CodeAgentLost, dead.GetErrorCode())
	assert.Zero(t, runs.Load(), "no attempt was left to run")
}

func TestVerdictSurvivesAFailedDeadLetter(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 30*time.Second)
	// Without the DLQ stream, dead letters cannot be stored.
	require.NoError(t, f.js.DeleteStream(ctx, protocol.StreamDLQ))
	var runs atomic.Int32
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("strict", func(context.Context, *agent.Job) error {
			runs.Add(1)
			return agent.NonRetryable(errors.New("never valid"))
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "v-1", Queue: "default", Kind: "strict"})
	verdict := f.events.WaitFor(t, 10*time.Second, "v-1", protocol.EventFailed)
	assert.Equal(t, protocol.ReasonNonRetryable, verdict.GetReason())
	require.NoError(t, topology.Ensure(ctx, f.js, topology.Config{})) // the DLQ stream is back

	dead := f.events.WaitFor(t, 20*time.Second, "v-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonNonRetryable, dead.GetReason())
	assert.Equal(t, "never valid", dead.GetError())
	assert.Equal(t, int32(1), runs.Load(), "the redelivery dead-lettered the job without running it again")
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	assert.Equal(t, "never valid", letters[0].GetLastError())
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
}

func TestPullingRecoversWhenTheConsumerIsRecreated(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 60*time.Second)
	var running, peak atomic.Int32
	f.startAgent(t, agent.Config{Concurrency: 2}, func(a *agent.Agent) {
		must(t, a.Register("work", func(context.Context, *agent.Job) error {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			defer running.Add(-1)
			time.Sleep(20 * time.Millisecond) // the work
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "before", Queue: "default", Kind: "work"})
	f.events.WaitFor(t, 10*time.Second, "before", protocol.EventSucceeded)

	// The consumer disappears under the agent's open request, then comes back.
	require.NoError(t, f.js.DeleteConsumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default")))
	_, err := topology.EnsureQueue(ctx, f.js, topology.Config{}, "default")
	require.NoError(t, err)
	for i := range 6 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("after-%d", i), Queue: "default", Kind: "work"})
	}
	for i := range 6 {
		f.events.WaitFor(t, 30*time.Second, fmt.Sprintf("after-%d", i), protocol.EventSucceeded)
	}
	assert.LessOrEqual(t, peak.Load(), int32(2), "slots were not lost or doubled across the 409")
}

func TestStopHandsBackJobsOfHandlersThatIgnoreCancellation(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: time.Minute}}})
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	stuck, err := agent.New(env.Env.Conn, agent.Config{ID: "stuck"}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	unblock := make(chan struct{})
	defer close(unblock)
	started := make(chan struct{}, 1)
	must(t, stuck.Register("deaf", func(context.Context, *agent.Job) error {
		started <- struct{}{}
		<-unblock // ignores its context
		return nil
	}, agent.KindOptions{}))
	require.NoError(t, stuck.Start(fleettest.Ctx(t, 10*time.Second)))
	fleettest.Publish(t, f.js, protocol.Job{ID: "deaf-1", Queue: "default", Kind: "deaf"})
	<-started

	var attempt atomic.Int32
	f.startAgent(t, agent.Config{ID: "other"}, func(a *agent.Agent) {
		must(t, a.Register("deaf", func(_ context.Context, job *agent.Job) error {
			attempt.Store(int32(job.Attempt))
			return nil
		}, agent.KindOptions{}))
	})
	stopCtx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	begin := time.Now()
	_ = stuck.Stop(stopCtx) // reports that a handler outlived the grace
	assert.Less(t, time.Since(begin), 4*time.Second, "Stop is bounded by its context")
	f.events.Wait(t, 10*time.Second, func(ev *jetfleetpb.JobEvent) bool {
		return ev.GetJobId() == "deaf-1" && ev.GetType() == protocol.EventSucceeded && ev.GetAgentId() == "other"
	})
	assert.Equal(t, int32(2), attempt.Load(), "the stuck attempt counts: its handler never gave the job back")
}

func TestDeliveryIsAnnouncedBeforeTheNextHeartbeatInterval(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	listed := make(chan struct{}, 1)
	sub, err := f.nc.Subscribe(protocol.HeartbeatSubject("slow-beat"), func(m *nats.Msg) {
		var hb jetfleetpb.Heartbeat
		if protocol.Unmarshal(m.Data, &hb) == nil && len(hb.GetJobs()) == 1 {
			select {
			case listed <- struct{}{}:
			default:
			}
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, f.nc.Flush())
	release := make(chan struct{})
	defer close(release)
	f.startAgent(t, agent.Config{ID: "slow-beat", HeartbeatInterval: time.Hour}, func(a *agent.Agent) {
		must(t, a.Register("hold", func(context.Context, *agent.Job) error {
			<-release
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "hb-1", Queue: "default", Kind: "hold"})
	select {
	case <-listed:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat listed the delivered job; the interval is an hour")
	}
}

func TestRedeliveryAfterALostTermIsTerminatedWithoutRunning(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 20*time.Second)
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "t-1", Queue: "default", Kind: "echo"})
	cons, err := topology.EnsureQueue(ctx, f.js, topology.Config{}, "default")
	require.NoError(t, err)
	// An earlier agent stored the dead letter and the dead event; its TERM was lost.
	batch, err := cons.Fetch(1)
	require.NoError(t, err)
	msg := <-batch.Messages()
	require.NotNil(t, msg)
	dead, err := protocol.Marshal(&jetfleetpb.JobEvent{Type: protocol.EventDead, JobId: "t-1", Queue: "default",
		Kind: "echo", StreamSequence: seq, Reason: protocol.ReasonNonRetryable})
	require.NoError(t, err)
	_, err = f.js.Publish(ctx, protocol.JobEventSubject("default", "echo", protocol.EventDead, "t-1"), dead)
	require.NoError(t, err)
	require.NoError(t, msg.Nak())

	var runs atomic.Int32
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("echo", func(context.Context, *agent.Job) error {
			runs.Add(1)
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
	assert.Zero(t, runs.Load(), "a dead job does not run again")
}

// TestStopDoesNotWaitForAckConfirmationsThatNeverCome: the job's consumer is
// deleted and created again while its handler runs, so the job's ack reaches
// a consumer that never delivered it, and no confirmation comes. Stop returns
// without waiting for it (asyncTimeout, 10s) and without an error: the ack
// was sent, and its confirmation would change nothing. (Stop does wait for
// the open pull request, which the deletion may leave unanswered: up to
// fetch_max_wait plus 2s.)
func TestStopDoesNotWaitForAckConfirmationsThatNeverCome(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	a, err := agent.New(env.Env.Conn, agent.Config{FetchMaxWait: 500 * time.Millisecond}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	must(t, a.Register("work", func(ctx context.Context, _ *agent.Job) error {
		if err := f.js.DeleteConsumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default")); err != nil {
			return err
		}
		_, err := topology.EnsureQueue(ctx, f.js, topology.Config{}, "default")
		return err
	}, agent.KindOptions{}))
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	fleettest.Publish(t, f.js, protocol.Job{ID: "orphaned-ack", Queue: "default", Kind: "work"})
	f.events.WaitFor(t, 10*time.Second, "orphaned-ack", protocol.EventSucceeded)

	stopping := time.Now()
	require.NoError(t, a.Stop(fleettest.Ctx(t, 20*time.Second)))
	assert.Less(t, time.Since(stopping), 6*time.Second, "Stop waited for a confirmation that never comes")
}

// TestPullingResumesSoonAfterAMissingConsumerReturns: while the queue's
// consumer is gone, pull requests find no responder (status 503). The agent
// asks again after a short pause instead of waiting to count each request
// lost (fetch_max_wait plus 2s, here 4s), so a job published once the
// consumer is back starts at once. (The request open when the consumer is
// deleted is not always answered: the first 503 may come only after it is
// counted lost.)
func TestPullingResumesSoonAfterAMissingConsumerReturns(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 30*time.Second)
	logs := fleettest.NewLogs()
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	env.Logger = logs.Wrap(env.Logger)
	a, err := agent.New(env.Env.Conn, agent.Config{FetchMaxWait: 2 * time.Second}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	started := make(chan time.Time, 1)
	must(t, a.Register("work", func(context.Context, *agent.Job) error {
		started <- time.Now()
		return nil
	}, agent.KindOptions{}))
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() { assert.NoError(t, a.Stop(fleettest.Ctx(t, 10*time.Second))) })

	require.NoError(t, f.js.DeleteConsumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default")))
	logs.Wait(t, 15*time.Second, "a pull request without responders",
		fleettest.MatchLog("pull request refused or ended", "description", "no responders: the queue's consumer is missing"))
	_, err = topology.EnsureQueue(ctx, f.js, topology.Config{}, "default")
	require.NoError(t, err)
	published := time.Now()
	fleettest.Publish(t, f.js, protocol.Job{ID: "back", Queue: "default", Kind: "work"})
	select {
	case at := <-started:
		assert.Less(t, at.Sub(published), 1500*time.Millisecond, "the agent waited for its request to count as lost")
	case <-ctx.Done():
		t.Fatal("the job never started")
	}
}

// TestSlotsStayExactWithSeveralRequestsOpen: an agent asks for freed slots
// beside its open request once that runs low, so the server holds several
// of its requests at once and spreads deliveries over them. When the
// consumer is deleted under them — one filled, one not — their ends say
// nothing of what they did not deliver; the agent must at once come back to
// holding exactly as many jobs as it has slots: none lost, none doubled.
func TestSlotsStayExactWithSeveralRequestsOpen(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 60*time.Second)
	const concurrency = 8 // asks beside an open request once at most 4 jobs are outstanding and 2 slots are free
	release := make(chan struct{})
	var running, peak atomic.Int32
	f.startAgent(t, agent.Config{Concurrency: concurrency, FetchMaxWait: 5 * time.Second}, func(a *agent.Agent) {
		must(t, a.Register("block", func(context.Context, *agent.Job) error {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			defer running.Add(-1)
			<-release
			return nil
		}, agent.KindOptions{}))
	})
	consumerInfo := func() *jetstream.ConsumerInfo {
		c, err := f.js.Consumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default"))
		require.NoError(t, err)
		return c.CachedInfo()
	}
	publish := func(prefix string, n int) {
		for i := range n {
			fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("%s-%d", prefix, i), Queue: "default", Kind: "block"})
		}
	}

	// Four jobs take half of the first request; one ends, and its slot
	// alone is not asked for (the request would be sent before the ack);
	// a second ends, and both are asked for beside the open request: two
	// requests open, for 4 and 2 more jobs.
	publish("first", 4)
	require.Eventually(t, func() bool { return running.Load() == 4 }, 10*time.Second, 5*time.Millisecond)
	release <- struct{}{}
	require.Eventually(t, func() bool { return consumerInfo().NumAckPending == 3 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, consumerInfo().NumWaiting, "a single free slot is not asked for beside an open request")
	release <- struct{}{}
	require.Eventually(t, func() bool {
		info := consumerInfo()
		return info.NumWaiting == 2 && info.NumAckPending == 2 // the ended jobs' acks are stored
	}, 10*time.Second, 5*time.Millisecond, "two requests open")
	// Five more cannot leave both requests unfilled (at most 3+1).
	publish("second", 5)
	require.Eventually(t, func() bool { return running.Load() == 7 }, 10*time.Second, 5*time.Millisecond)

	require.NoError(t, f.js.DeleteConsumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default")))
	_, err := topology.EnsureQueue(ctx, f.js, topology.Config{}, "default")
	require.NoError(t, err)
	publish("after", 12)
	// The seven jobs of the deleted consumer still run: one slot is free,
	// and is asked for again after the refusal pause, not after the
	// requests' expiry. The new consumer offers the seven again (never
	// acked), then the twelve new ones.
	require.Eventually(t, func() bool { return running.Load() == concurrency }, 3*time.Second, 5*time.Millisecond,
		"every slot the deleted consumer's requests held is asked for again at once")
	time.Sleep(2 * time.Second) // no event marks "did not over-fetch": give the agent time to
	info := consumerInfo()
	assert.Equal(t, 1, info.NumAckPending, "the new consumer's jobs fill exactly the free slots")
	assert.Equal(t, uint64(7+12-1), info.NumPending)
	assert.Equal(t, int32(concurrency), peak.Load())
	close(release)
	for i := range 12 {
		f.events.WaitFor(t, 30*time.Second, fmt.Sprintf("after-%d", i), protocol.EventSucceeded)
	}
}
