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

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestSlowServerNoAckWithoutOutcomeNoStorm drains a backlog through an
// agent against a server that syncs every write to disk before answering
// (sync_interval: always), which answers far slower than the agent could
// publish. The agent backs off instead of storming the server with resends,
// is stopped in the middle within its grace, and a second agent drains the
// rest. Counted at the end: no job left JOBS without its outcome stored, no
// event stored twice, no event reported lost, no more jobs held unacked
// than the agent's bounds allow, every job run — with events
// in fast batches and in atomic ones (topology.event_batches).
func TestSlowServerNoAckWithoutOutcomeNoStorm(t *testing.T) {
	t.Parallel()
	for _, batches := range []string{topology.EventBatchesFast, topology.EventBatchesAtomic} {
		t.Run(batches, func(t *testing.T) {
			t.Parallel()
			testSlowServerNoAckWithoutOutcomeNoStorm(t, topology.Config{EventBatches: batches})
		})
	}
}

func testSlowServerNoAckWithoutOutcomeNoStorm(t *testing.T, topo topology.Config) {
	const concurrency, maxUnconfirmed = 50, 100
	srv := natstest.ServerWith(t, embedded.Options{SyncAlways: true})
	_, js := natstest.JetStream(t, srv)
	logs := fleettest.NewLogs()
	start := func(id string) *agent.Agent {
		env := fleettest.NewEnv(t, srv, topo)
		env.Logger = logs.Wrap(env.Logger)
		a, err := agent.New(env.Env.Conn, agent.Config{ID: id, Concurrency: concurrency, MaxUnconfirmed: maxUnconfirmed}, agent.WithEnv(env.Env))
		require.NoError(t, err)
		must(t, a.Register("noop", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
		require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
		return a
	}

	require.NoError(t, topology.Ensure(fleettest.Ctx(t, 10*time.Second), js, topo))
	const n = 3000
	seqs := publishMany(t, js, n)
	first := start("first")
	// The jobs the agent holds (delivered, not acked as far as the server
	// knows) stay bounded while its events and acks wait for the slow
	// server: running ones, and those whose outcome or ack awaits
	// confirmation (MaxUnconfirmed, plus the slots kept past it).
	consumer, err := js.Consumer(fleettest.Ctx(t, 10*time.Second), protocol.StreamJobs, protocol.QueueConsumer("default"))
	require.NoError(t, err)
	mostHeld := 0
	require.Eventually(t, func() bool { // polling the consumer's state while the backlog drains: the server sends no event for it
		if info, err := consumer.Info(fleettest.Ctx(t, 5*time.Second)); err == nil {
			mostHeld = max(mostHeld, info.NumAckPending)
		}
		return fleettest.StreamMsgs(t, js, protocol.StreamJobs) < n/2
	}, time.Minute, 10*time.Millisecond, "the first agent drains half the backlog")
	assert.LessOrEqual(t, mostHeld, maxUnconfirmed+2*concurrency, "jobs held by the agent, unacked")
	t.Logf("most jobs held unacked: %d", mostHeld)
	const grace = 5 * time.Second
	stopCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	stopping := time.Now()
	require.NoError(t, first.Stop(stopCtx))
	assert.Less(t, time.Since(stopping), grace, "Stop ran past its grace")

	// Every job the first agent removed from JOBS has its outcome stored.
	ctx := fleettest.Ctx(t, time.Minute)
	jobs, err := js.Stream(ctx, protocol.StreamJobs)
	require.NoError(t, err)
	events, err := js.Stream(ctx, protocol.StreamEvents)
	require.NoError(t, err)
	ackedWithoutOutcome := 0
	for id, seq := range seqs {
		if _, err := jobs.GetMsg(ctx, seq); !errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // still queued: handed back or never taken
		}
		if _, err := events.GetLastMsgForSubject(ctx, protocol.JobEventSubject("default", "noop", protocol.EventSucceeded, id)); err != nil {
			ackedWithoutOutcome++
		}
	}
	assert.Zero(t, ackedWithoutOutcome, "jobs acked without a stored outcome")

	second := start("second")
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, second.Stop(c))
	})
	require.Eventually(t, func() bool { return fleettest.StreamMsgs(t, js, protocol.StreamJobs) == 0 }, time.Minute, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		info, err := events.Info(ctx, jetstream.WithSubjectFilter(protocol.JobEventsOfType("default", "noop", protocol.EventSucceeded)))
		return err == nil && info.State.Msgs >= n
	}, time.Minute, 10*time.Millisecond, "every job succeeded")
	info, err := events.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, info.State.NumSubjects, info.State.Msgs, "an event was stored twice")
	assert.Zero(t, logs.Count(fleettest.MatchLog("job event not stored after retries")), "events reported lost")
	t.Logf("events sent again: %d; outcomes not stored in time: %d", logs.Count(fleettest.MatchLog("job event not stored; sending again")),
		logs.Count(fleettest.MatchLog("outcome of the job not stored; not acked, JetStream delivers it again")))
}

// publishMany publishes n no-op jobs asynchronously and returns each job's
// stream sequence by job id.
func publishMany(t *testing.T, js jetstream.JetStream, n int) map[string]uint64 {
	t.Helper()
	futures := make(map[string]jetstream.PubAckFuture, n)
	for i := range n {
		job := protocol.Job{ID: fmt.Sprintf("d-%d", i), Queue: "default", Kind: "noop", Payload: []byte(`{}`)}
		msg, err := job.Msg()
		require.NoError(t, err)
		f, err := js.PublishMsgAsync(msg)
		require.NoError(t, err)
		futures[job.ID] = f
	}
	seqs := make(map[string]uint64, n)
	for id, f := range futures {
		select {
		case ack := <-f.Ok():
			seqs[id] = ack.Sequence
		case err := <-f.Err():
			t.Fatalf("publish %s: %v", id, err)
		case <-time.After(time.Minute):
			t.Fatalf("publish %s: no answer", id)
		}
	}
	return seqs
}

// TestJobIsNotAckedWhileItsOutcomeCannotBeStored: the events stream refuses
// every write for a while (it is full and discards new messages). The
// agent's jobs succeed, but none is acked without its outcome stored: they
// stay in JOBS, come back once the agent gave up on their events, and run
// again once events can be stored.
func TestJobIsNotAckedWhileItsOutcomeCannotBeStored(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, time.Minute)
	events, err := f.js.Stream(ctx, protocol.StreamEvents)
	require.NoError(t, err)
	open := events.CachedInfo().Config
	logs := fleettest.NewLogs()
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology) // provisions the topology: before the stream is made full
	env.Logger = logs.Wrap(env.Logger)
	full := open
	full.MaxMsgs, full.Discard = 1, jetstream.DiscardNew
	_, err = f.js.PublishMsg(ctx, &nats.Msg{Subject: "events.job.default.other.started.x", Data: []byte(`{}`)})
	require.NoError(t, err)
	_, err = f.js.UpdateStream(ctx, full)
	require.NoError(t, err)

	a, err := agent.New(env.Env.Conn, agent.Config{ID: "refused"}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	var runs atomic.Int32
	must(t, a.Register("noop", func(context.Context, *agent.Job) error { runs.Add(1); return nil }, agent.KindOptions{}))
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, a.Stop(c))
	})
	for i := range 5 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("r-%d", i), Queue: "default", Kind: "noop"})
	}
	logs.Wait(t, 30*time.Second, "the agent gives up on the outcomes",
		fleettest.MatchLog("outcome of the job not stored; not acked, JetStream delivers it again"))
	assert.Equal(t, uint64(5), fleettest.StreamMsgs(t, f.js, protocol.StreamJobs), "a job was acked without its outcome stored")

	_, err = f.js.UpdateStream(ctx, open)
	require.NoError(t, err)
	for i := range 5 {
		f.events.WaitFor(t, 30*time.Second, fmt.Sprintf("r-%d", i), protocol.EventSucceeded)
	}
	require.Eventually(t, func() bool { return fleettest.StreamMsgs(t, f.js, protocol.StreamJobs) == 0 }, 10*time.Second, 10*time.Millisecond)
	// A job whose outcome the agent gave up on ran again; one whose resend
	// got through once the stream took events again did not need to.
	gaveUp := logs.Count(fleettest.MatchLog("outcome of the job not stored; not acked, JetStream delivers it again"))
	assert.Positive(t, gaveUp)
	assert.Equal(t, int32(5+gaveUp), runs.Load(), "each job given up on ran again, and only those")
}

// TestOutcomeWaitsThroughAServerOutage: a job finishes while the server is
// down for longer than an event's tries span. Its outcome waits for the
// connection instead of being given up, is stored once the server is back,
// and the job is acked: it does not run again.
func TestOutcomeWaitsThroughAServerOutage(t *testing.T) {
	t.Parallel()
	srv := natstest.RestartableServer(t, embedded.Options{})
	topo := topology.Config{}
	logs := fleettest.NewLogs()
	env := fleettest.NewEnvURL(t, srv.URL(), topo)
	env.Logger = logs.Wrap(env.Logger)
	a, err := agent.New(env.Env.Conn, agent.Config{ID: "outage"}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	var runs atomic.Int32
	running, finish := make(chan struct{}), make(chan struct{})
	must(t, a.Register("work", func(context.Context, *agent.Job) error {
		if runs.Add(1) == 1 {
			close(running)
			<-finish
		}
		return nil
	}, agent.KindOptions{}))
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Stop(c)
	})
	_, js := natstest.JetStream(t, srv.Server())
	fleettest.Publish(t, js, protocol.Job{ID: "through-outage", Queue: "default", Kind: "work"})
	<-running

	srv.Stop()
	close(finish) // the job succeeds while the server is away
	logs.Wait(t, 10*time.Second, "the outcome waits for the connection",
		fleettest.MatchLog("job event not stored while disconnected; sending it again once reconnected"))
	// The outage outlasts the tries of an event (about 3 s of backoff).
	down := time.NewTimer(4 * time.Second)
	<-down.C
	srv.Start(t)

	nc, js := natstest.JetStream(t, srv.Server())
	events := fleettest.WatchJobEvents(t, nc)
	fleettest.WaitLatestEvent(t, js, "through-outage", protocol.EventSucceeded, 20*time.Second)
	fleettest.WaitStreamMsgs(t, js, protocol.StreamJobs, 0, 20*time.Second)
	assert.Equal(t, int32(1), runs.Load(), "the job ran again")
	assert.Subset(t, []string{protocol.EventSucceeded}, events.Of("through-outage"), "no later delivery ran or skipped it")
	assert.Zero(t, logs.Count(fleettest.MatchLog("outcome of the job not stored; not acked, JetStream delivers it again")))
}
