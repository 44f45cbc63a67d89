package agent_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func TestMain(m *testing.M) {
	natstest.VerifyNoLeaks(m)
}

type fixture struct {
	srv    *server.Server
	env    *fleettest.Env
	nc     *nats.Conn
	js     jetstream.JetStream
	events *fleettest.Events
}

func setup(t *testing.T, topo topology.Config) *fixture {
	t.Helper()
	srv := natstest.Server(t)
	env := fleettest.NewEnv(t, srv, topo)
	nc, js := natstest.JetStream(t, srv)
	return &fixture{srv: srv, env: env, nc: nc, js: js, events: fleettest.WatchJobEvents(t, nc)}
}

// startAgent starts an agent with its own connection and stops it at the end of the test.
func (f *fixture) startAgent(t *testing.T, cfg agent.Config, register func(a *agent.Agent)) *agent.Agent {
	t.Helper()
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	a, err := agent.New(env.Env.Conn, cfg, agent.WithEnv(env.Env))
	require.NoError(t, err)
	register(a)
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		assert.NoError(t, a.Stop(ctx))
	})
	return a
}

func must(t *testing.T, err error) {
	t.Helper()
	require.NoError(t, err)
}

func TestJobSucceeds(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	got := make(chan string, 1)
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("echo", func(ctx context.Context, job *agent.Job) error {
			assert.Equal(t, job, agent.JobFrom(ctx), "the job travels in the context")
			got <- string(job.Payload)
			return nil
		}, agent.KindOptions{}))
	})
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "job-1", Queue: "default", Kind: "echo", Payload: []byte(`{"hello":1}`)})
	assert.Equal(t, `{"hello":1}`, <-got)
	ev := f.events.WaitFor(t, 10*time.Second, "job-1", protocol.EventSucceeded)
	assert.Equal(t, uint32(1), ev.GetAttempt())
	assert.Equal(t, seq, ev.GetStreamSequence())
	assert.Equal(t, []string{protocol.EventSucceeded}, f.events.Of("job-1"), "a quick job has one event")
	st := fleettest.WaitLatestEvent(t, f.js, "job-1", protocol.EventSucceeded, 10*time.Second)
	assert.Equal(t, protocol.EventSucceeded, st.GetType(), "the latest event is the job's status")
	assert.NotEmpty(t, st.GetTraceId())
	assert.NotEmpty(t, st.GetAgentId())
	assert.False(t, st.GetStartedAt().AsTime().IsZero())
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
}

func TestRetriesWithConfiguredDelaysThenSucceeds(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	var mu sync.Mutex
	var runs []time.Time
	f.startAgent(t, agent.Config{Retry: agent.RetryConfig{InitialDelay: 400 * time.Millisecond, Multiplier: 2, Jitter: 0.1}},
		func(a *agent.Agent) {
			must(t, a.Register("flaky", func(ctx context.Context, job *agent.Job) error {
				mu.Lock()
				defer mu.Unlock()
				runs = append(runs, time.Now())
				if job.Attempt < 3 {
					return fmt.Errorf("transient failure %d", job.Attempt)
				}
				return nil
			}, agent.KindOptions{}))
		})
	fleettest.Publish(t, f.js, protocol.Job{ID: "flaky-1", Queue: "default", Kind: "flaky"})
	f.events.WaitFor(t, 20*time.Second, "flaky-1", protocol.EventSucceeded)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, runs, 3, "two failures, then success")
	// Delays are 400ms then 800ms, each ±10% jitter. The events carry the delay the agent chose, which pins the
	// schedule exactly; the gaps between runs show the delay was honoured (never shorter) and not lost (the bound
	// above is loose: the server's redelivery and the next pull add scheduling time, more under -race on 2 cores).
	assert.Equal(t, []string{"retrying", "retrying", "succeeded"}, f.events.Of("flaky-1"))
	retries := map[int]*jetfleetpb.JobEvent{}
	for _, ev := range f.events.All() {
		if ev.GetJobId() == "flaky-1" && ev.GetType() == protocol.EventRetrying {
			retries[int(ev.GetAttempt())-1] = ev
		}
	}
	require.Len(t, retries, 2)
	for i, want := range []time.Duration{400 * time.Millisecond, 800 * time.Millisecond} {
		chosen := retries[i].GetRetryIn().AsDuration()
		assert.InDelta(t, want.Seconds(), chosen.Seconds(), want.Seconds()*0.1+0.001, "retry %d's delay", i+1)
		gap := runs[i+1].Sub(runs[i])
		assert.GreaterOrEqual(t, gap, chosen, "retry %d came too soon", i+1)
		assert.Less(t, gap, chosen+3*time.Second, "retry %d came too late", i+1)
	}
	assert.Equal(t, "transient failure 1", retries[0].GetError())
	assert.Equal(t, protocol.CodeHandlerError, retries[0].GetErrorCode())
}

func TestBackoffHeaderOverridesPolicy(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.startAgent(t, agent.Config{Retry: agent.RetryConfig{Jitter: -1}}, func(a *agent.Agent) {
		must(t, a.Register("flaky", func(ctx context.Context, job *agent.Job) error {
			if job.Attempt == 1 {
				return errors.New("once")
			}
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "b-1", Queue: "default", Kind: "flaky", Backoff: []time.Duration{150 * time.Millisecond}})
	ev := f.events.WaitFor(t, 10*time.Second, "b-1", protocol.EventRetrying)
	assert.Equal(t, 150*time.Millisecond, ev.GetRetryIn().AsDuration(), "Jetfleet-Backoff wins, jitter disabled")
	f.events.WaitFor(t, 10*time.Second, "b-1", protocol.EventSucceeded)
}

var errBadInput = errors.New("bad input")

func TestNonRetryableGoesToDeadLetterOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	var runs atomic.Int32
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("strict", func(ctx context.Context, job *agent.Job) error {
			runs.Add(1)
			return fmt.Errorf("validating: %w", errBadInput)
		}, agent.KindOptions{Retry: agent.RetryPolicy{NonRetryable: []error{errBadInput}}}))
		must(t, a.Register("explicit", func(ctx context.Context, job *agent.Job) error {
			runs.Add(1)
			return agent.NonRetryable(errors.New("refund window closed"))
		}, agent.KindOptions{}))
	})
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "nr-1", Queue: "default", Kind: "strict", Payload: []byte("p1")})
	fleettest.Publish(t, f.js, protocol.Job{ID: "nr-2", Queue: "default", Kind: "explicit"})
	f.events.WaitFor(t, 10*time.Second, "nr-1", protocol.EventDead)
	f.events.WaitFor(t, 10*time.Second, "nr-2", protocol.EventDead)
	assert.Equal(t, int32(2), runs.Load(), "each ran once")

	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 2)
	byID := map[string]*jetfleetpb.DeadLetter{}
	for _, dl := range letters {
		byID[dl.GetJobId()] = dl
	}
	dl := byID["nr-1"]
	assert.Equal(t, protocol.ReasonNonRetryable, dl.GetReason())
	assert.Equal(t, "validating: bad input", dl.GetLastError())
	assert.Equal(t, uint32(1), dl.GetAttempts())
	assert.Equal(t, "jobs.default.strict", dl.GetOriginalSubject())
	assert.Equal(t, seq, dl.GetOriginalSequence())
	assert.Equal(t, []byte("p1"), dl.GetPayload())
	assert.Equal(t, []string{"nr-1"}, dl.GetHeaders()[protocol.HeaderJobID].GetValues(), "original headers kept")
	assert.Equal(t, protocol.ReasonNonRetryable, byID["nr-2"].GetReason())
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
	assert.Equal(t, protocol.EventDead, fleettest.WaitLatestEvent(t, f.js, "nr-1", protocol.EventDead, 10*time.Second).GetType())
}

func TestLastAttemptDeadLetters(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.startAgent(t, agent.Config{Retry: agent.RetryConfig{InitialDelay: 50 * time.Millisecond}}, func(a *agent.Agent) {
		must(t, a.Register("doomed", func(ctx context.Context, job *agent.Job) error {
			_, _ = job.Output().Write([]byte("tried hard\n"))
			return errors.New("still broken")
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "d-1", Queue: "default", Kind: "doomed", MaxAttempts: 3})
	dead := f.events.WaitFor(t, 10*time.Second, "d-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonMaxAttempts, dead.GetReason())
	assert.Equal(t, uint32(3), dead.GetAttempt())
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	assert.Equal(t, uint32(3), letters[0].GetAttempts())
	assert.Equal(t, "still broken", letters[0].GetLastError())
	assert.Equal(t, "tried hard\n", letters[0].GetOutputTail())
}

func TestLongJobIsNotRedelivered(t *testing.T) {
	t.Parallel()
	ackWait := time.Second
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: ackWait}}})
	var runs atomic.Int32
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("long", func(ctx context.Context, job *agent.Job) error {
			runs.Add(1)
			select {
			case <-time.After(3*ackWait + 500*time.Millisecond): // the work itself: longer than 3× AckWait
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "long-1", Queue: "default", Kind: "long"})
	ev := f.events.WaitFor(t, 20*time.Second, "long-1", protocol.EventSucceeded)
	assert.Equal(t, int32(1), runs.Load())
	assert.Equal(t, uint32(1), ev.GetAttempt())
	cons, err := f.js.Consumer(fleettest.Ctx(t, 5*time.Second), protocol.StreamJobs, "queue-default")
	require.NoError(t, err)
	info, err := cons.Info(fleettest.Ctx(t, 5*time.Second))
	require.NoError(t, err)
	assert.Zero(t, info.NumRedelivered, "progress reports kept JetStream from redelivering")
}

func TestMalformedInputIsDeadLetteredAndAgentKeepsRunning(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	type order struct {
		ID int `json:"id"`
	}
	var good atomic.Int32
	f.startAgent(t, agent.Config{MaxPayload: 64}, func(a *agent.Agent) {
		must(t, a.Register("order", agent.Typed(func(ctx context.Context, job *agent.Job, o order) error {
			if o.ID > 0 {
				good.Add(1)
			}
			return nil
		}), agent.KindOptions{}))
	})
	ctx := fleettest.Ctx(t, 10*time.Second)
	// Undecodable payload for a typed handler.
	fleettest.Publish(t, f.js, protocol.Job{ID: "m-1", Queue: "default", Kind: "order", Payload: []byte(`{"id":"x"`)})
	// A kind nobody runs.
	fleettest.Publish(t, f.js, protocol.Job{ID: "m-2", Queue: "default", Kind: "nobody-runs-this"})
	// Garbage headers, published raw.
	_, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: "jobs.default.order", Data: []byte(`{"id":3}`),
		Header: nats.Header{protocol.HeaderJobID: {"m-3"}, protocol.HeaderTimeout: {"soon"}, protocol.HeaderMaxAttempts: {"many"}}})
	require.NoError(t, err)
	// Oversized payload.
	fleettest.Publish(t, f.js, protocol.Job{ID: "m-4", Queue: "default", Kind: "order", Payload: make([]byte, 100)})
	// A kind token that is not one: 200 characters.
	_, err = f.js.PublishMsg(ctx, &nats.Msg{Subject: "jobs.default." + strings.Repeat("k", 200), Data: []byte("x"),
		Header: nats.Header{protocol.HeaderJobID: {"m-5"}}})
	require.NoError(t, err)
	// And a good one afterwards.
	fleettest.Publish(t, f.js, protocol.Job{ID: "ok", Queue: "default", Kind: "order", Payload: []byte(`{"id":7}`)})

	want := map[string]string{
		"m-1": protocol.ReasonMalformedPayload, "m-2": protocol.ReasonUnknownKind, "m-3": protocol.ReasonInvalidHeaders,
		"m-4": protocol.ReasonPayloadTooLarge, "m-5": protocol.ReasonInvalidHeaders,
	}
	for id, reason := range want {
		ev := f.events.WaitFor(t, 10*time.Second, id, protocol.EventDead)
		assert.Equal(t, reason, ev.GetReason(), id)
	}
	f.events.WaitFor(t, 10*time.Second, "ok", protocol.EventSucceeded)
	assert.Equal(t, int32(1), good.Load())
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, len(want), "each bad message dead-lettered exactly once")
	for _, dl := range letters {
		assert.Equal(t, want[dl.GetJobId()], dl.GetReason(), dl.GetJobId())
		assert.NotEmpty(t, dl.GetLastError(), dl.GetJobId())
		if dl.GetJobId() == "m-3" {
			assert.Contains(t, dl.GetLastError(), "Jetfleet-Timeout")
			assert.Contains(t, dl.GetLastError(), "Jetfleet-Max-Attempts")
		}
	}
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
}

func TestPanicIsRecoveredAndRetried(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.startAgent(t, agent.Config{Retry: agent.RetryConfig{InitialDelay: 50 * time.Millisecond}}, func(a *agent.Agent) {
		must(t, a.Register("boom", func(ctx context.Context, job *agent.Job) error {
			if job.Attempt == 1 {
				var m map[string]int
				m["x"] = 1 //nolint:staticcheck // SA5000 on purpose: the nil map write is the panic under test
			}
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "p-1", Queue: "default", Kind: "boom"})
	ev := f.events.WaitFor(t, 10*time.Second, "p-1", protocol.EventRetrying)
	assert.Equal(t, protocol.CodePanic, ev.GetErrorCode())
	assert.Contains(t, ev.GetError(), "assignment to entry in nil map")
	assert.Contains(t, ev.GetError(), "agent_test.go", "the stack is kept")
	f.events.WaitFor(t, 10*time.Second, "p-1", protocol.EventSucceeded)
}

func TestTimeoutFailsTheAttempt(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("slow", func(ctx context.Context, job *agent.Job) error {
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "t-1", Queue: "default", Kind: "slow", Timeout: 200 * time.Millisecond, MaxAttempts: 1})
	ev := f.events.WaitFor(t, 10*time.Second, "t-1", protocol.EventFailed)
	assert.Equal(t, protocol.CodeTimeout, ev.GetErrorCode())
	assert.Equal(t, protocol.ReasonMaxAttempts, ev.GetReason())
}

func TestSnoozeDoesNotSpendAnAttempt(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	var runs atomic.Int32
	f.startAgent(t, agent.Config{Retry: agent.RetryConfig{InitialDelay: 20 * time.Millisecond}}, func(a *agent.Agent) {
		must(t, a.Register("sleepy", func(ctx context.Context, job *agent.Job) error {
			switch runs.Add(1) {
			case 1, 2:
				return agent.Snooze(50 * time.Millisecond)
			default:
				return fmt.Errorf("fail at attempt %d", job.Attempt)
			}
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "s-1", Queue: "default", Kind: "sleepy", MaxAttempts: 2})
	dead := f.events.WaitFor(t, 10*time.Second, "s-1", protocol.EventDead)
	assert.Equal(t, int32(4), runs.Load(), "two snoozes, then two real attempts")
	assert.Equal(t, uint32(2), dead.GetAttempt())
	assert.Equal(t, uint32(2), dead.GetSnoozes())
}

func TestRedeliveryOfSucceededJobIsAckedWithoutRunning(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 20*time.Second)
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "dup-1", Queue: "default", Kind: "echo"})
	cons, err := topology.EnsureQueue(ctx, f.js, topology.Config{}, "default")
	require.NoError(t, err)
	// An earlier agent ran the job and stored "succeeded", but its ack was lost:
	// take the delivery without acking, and hand it back.
	batch, err := cons.Fetch(1)
	require.NoError(t, err)
	msg := <-batch.Messages()
	require.NotNil(t, msg)
	done, err := protocol.Marshal(&jetfleetpb.JobEvent{Type: protocol.EventSucceeded, JobId: "dup-1", Queue: "default",
		Kind: "echo", StreamSequence: seq})
	require.NoError(t, err)
	_, err = f.js.Publish(ctx, protocol.JobEventSubject("default", "echo", protocol.EventSucceeded, "dup-1"), done)
	require.NoError(t, err)
	require.NoError(t, msg.Nak())

	var runs atomic.Int32
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("echo", func(ctx context.Context, job *agent.Job) error {
			runs.Add(1)
			return nil
		}, agent.KindOptions{}))
	})
	f.events.WaitFor(t, 10*time.Second, "dup-1", protocol.EventSkippedDuplicate)
	assert.Zero(t, runs.Load(), "the job did not run again")
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)

	// The same job id published again as a new message is a new job and runs.
	again := fleettest.Publish(t, f.js, protocol.Job{ID: "dup-1", Queue: "default", Kind: "echo", Header: nats.Header{protocol.HeaderMsgID: {"dup-1-again"}}})
	f.events.Wait(t, 10*time.Second, func(ev *jetfleetpb.JobEvent) bool {
		return ev.GetJobId() == "dup-1" && ev.GetType() == protocol.EventSucceeded && ev.GetStreamSequence() == again
	})
	assert.Equal(t, int32(1), runs.Load())
}

func TestCancelCommandEndsJobAsCancelled(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	started := make(chan struct{}, 2)
	a := f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("wait", func(ctx context.Context, job *agent.Job) error {
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "c-1", Queue: "default", Kind: "wait"})
	<-started
	f.events.WaitFor(t, 10*time.Second, "c-1", protocol.EventStarted)
	send := func(cmd *jetfleetpb.AgentCommand) error {
		data, err := protocol.Marshal(cmd)
		require.NoError(t, err)
		reply, err := f.nc.Request(protocol.ControlSubject(a.ID()), data, 5*time.Second)
		require.NoError(t, err)
		var doc jetfleetpb.Error
		require.NoError(t, protocol.Unmarshal(reply.Data, &doc))
		return protocol.FromDoc(&doc)
	}
	err := send(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: "nope"})
	assert.True(t, errors.Is(err, protocol.Code(protocol.CodeNotFound)), "%v", err)
	require.NoError(t, send(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: "c-1", Reason: "operator asked"}))

	ev := f.events.WaitFor(t, 10*time.Second, "c-1", protocol.EventCancelled)
	assert.Contains(t, ev.GetError(), "operator asked")
	assert.Equal(t, protocol.ReasonCancelled, ev.GetReason())
	assert.Equal(t, protocol.CodeCancelled, ev.GetErrorCode())
	assert.Equal(t, protocol.EventCancelled, fleettest.WaitLatestEvent(t, f.js, "c-1", protocol.EventCancelled, 10*time.Second).GetType())
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
	assert.Empty(t, fleettest.DeadLetters(t, f.js), "a cancelled job is no dead letter")

	// With dead_letter, the job is dead-lettered with reason cancelled.
	fleettest.Publish(t, f.js, protocol.Job{ID: "c-2", Queue: "default", Kind: "wait"})
	f.events.WaitFor(t, 10*time.Second, "c-2", protocol.EventStarted)
	require.NoError(t, send(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: "c-2", Reason: "bad input", DeadLetter: true}))
	dead := f.events.WaitFor(t, 10*time.Second, "c-2", protocol.EventDead)
	assert.Equal(t, protocol.ReasonCancelled, dead.GetReason())
	assert.Contains(t, dead.GetError(), "bad input")
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	assert.Equal(t, "c-2", letters[0].GetJobId())
}

// TestCancelInBucketEndsAJobAlreadyRunning: a cancel that reaches bucket
// cancels while the job runs (it started before any heartbeat listed it,
// so the supervisor told no agent) ends it too; one stored before the job
// message was is for an earlier job with that id, and changes nothing.
func TestCancelInBucketEndsAJobAlreadyRunning(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 30*time.Second)
	kv, err := f.js.KeyValue(ctx, protocol.BucketCancels)
	require.NoError(t, err)
	putCancel := func(jobID string) {
		data, err := protocol.Marshal(&jetfleetpb.JobCancel{JobId: jobID, Reason: "stop it", RequestedBy: "test"})
		require.NoError(t, err)
		_, err = kv.Put(ctx, protocol.JobToken(jobID), data)
		require.NoError(t, err)
	}
	putCancel("older-cancel")
	started := make(chan string, 2)
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("wait", func(ctx context.Context, job *agent.Job) error {
			started <- job.ID
			if job.ID == "older-cancel" {
				return nil
			}
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "older-cancel", Queue: "default", Kind: "wait"})
	f.events.WaitFor(t, 10*time.Second, "older-cancel", protocol.EventSucceeded)
	fleettest.Publish(t, f.js, protocol.Job{ID: "b-1", Queue: "default", Kind: "wait"})
	assert.Equal(t, "older-cancel", <-started)
	assert.Equal(t, "b-1", <-started)
	putCancel("b-1")
	ev := f.events.WaitFor(t, 10*time.Second, "b-1", protocol.EventCancelled)
	assert.Contains(t, ev.GetError(), "stop it")
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
	assert.Empty(t, fleettest.DeadLetters(t, f.js))
}

// TestTimeoutCommandFailsTheAttemptAsATimeout: the supervisor's timeout
// command (an attempt past its deadline and the grace) ends the attempt as
// timed out — retried while attempts remain — not as a cancellation.
func TestTimeoutCommandFailsTheAttemptAsATimeout(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	var attempts atomic.Int32
	started := make(chan struct{}, 2)
	a := f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("hang", func(ctx context.Context, job *agent.Job) error {
			if attempts.Add(1) > 1 {
				return nil // the retry succeeds
			}
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{Retry: agent.RetryPolicy{MaxAttempts: 3, InitialDelay: 10 * time.Millisecond, Jitter: -1}}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "t-1", Queue: "default", Kind: "hang"})
	<-started
	f.events.WaitFor(t, 10*time.Second, "t-1", protocol.EventStarted)
	data, err := protocol.Marshal(&jetfleetpb.AgentCommand{Action: protocol.CommandTimeout, JobId: "t-1", Reason: "ran 2m, past 1m and the grace"})
	require.NoError(t, err)
	reply, err := f.nc.Request(protocol.ControlSubject(a.ID()), data, 5*time.Second)
	require.NoError(t, err)
	var doc jetfleetpb.Error
	require.NoError(t, protocol.Unmarshal(reply.Data, &doc))
	require.NoError(t, protocol.FromDoc(&doc), "the agent accepts the timeout command")

	retrying := f.events.WaitFor(t, 10*time.Second, "t-1", protocol.EventRetrying)
	assert.Equal(t, protocol.CodeTimeout, retrying.GetErrorCode())
	assert.Contains(t, retrying.GetError(), "timed out by the supervisor")
	f.events.WaitFor(t, 10*time.Second, "t-1", protocol.EventSucceeded)
	assert.Equal(t, int32(2), attempts.Load())
	for _, typ := range f.events.Of("t-1") {
		assert.NotEqual(t, protocol.EventCancelled, typ, "a timeout is not a cancellation")
		assert.NotEqual(t, protocol.EventDead, typ)
	}
}

func TestConcurrencyBoundsWhatTheAgentHolds(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	release := make(chan struct{})
	var running, peak atomic.Int32
	f.startAgent(t, agent.Config{Concurrency: 3}, func(a *agent.Agent) {
		must(t, a.Register("block", func(ctx context.Context, job *agent.Job) error {
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			defer running.Add(-1)
			<-release
			return nil
		}, agent.KindOptions{}))
	})
	for i := range 10 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("cc-%d", i), Queue: "default", Kind: "block"})
	}
	require.Eventually(t, func() bool { return running.Load() == 3 }, 10*time.Second, 10*time.Millisecond)
	cons, err := f.js.Consumer(fleettest.Ctx(t, 5*time.Second), protocol.StreamJobs, "queue-default")
	require.NoError(t, err)
	// Give the agent every chance to over-fetch while its slots are full.
	time.Sleep(3 * agent.DefaultFetchMaxWait) // no event marks "did not fetch"; wait out several pull cycles
	info, err := cons.Info(fleettest.Ctx(t, 5*time.Second))
	require.NoError(t, err)
	assert.Equal(t, 3, info.NumAckPending, "the agent holds exactly as many jobs as it runs")
	assert.Equal(t, uint64(7), info.NumPending)
	close(release)
	for i := range 10 {
		f.events.WaitFor(t, 10*time.Second, fmt.Sprintf("cc-%d", i), protocol.EventSucceeded)
	}
	assert.Equal(t, int32(3), peak.Load())
}

// TestPrefetchHoldsJobsBeyondConcurrency: an agent with prefetch holds
// Concurrency + Prefetch jobs and runs Concurrency of them; the rest wait,
// kept alive past AckWait, and their attempt (and its timeout) starts only
// when they run.
func TestPrefetchHoldsJobsBeyondConcurrency(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: time.Second}}})
	const timeout = time.Minute
	release := make(chan struct{})
	var running, peak atomic.Int32
	var mu sync.Mutex
	lateDeadlines := map[string]time.Duration{} // job → how far its deadline is from its start + timeout
	f.startAgent(t, agent.Config{Concurrency: 2, Prefetch: 3}, func(a *agent.Agent) {
		must(t, a.Register("block", func(ctx context.Context, job *agent.Job) error {
			started := time.Now()
			mu.Lock()
			lateDeadlines[job.ID] = started.Add(timeout).Sub(job.Deadline)
			mu.Unlock()
			n := running.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			defer running.Add(-1)
			<-release
			return nil
		}, agent.KindOptions{Timeout: timeout}))
	})
	for i := range 7 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("pf-%d", i), Queue: "default", Kind: "block"})
	}
	cons, err := f.js.Consumer(fleettest.Ctx(t, 5*time.Second), protocol.StreamJobs, "queue-default")
	require.NoError(t, err)
	held := func() int {
		info, err := cons.Info(fleettest.Ctx(t, 5*time.Second))
		require.NoError(t, err)
		return info.NumAckPending
	}
	require.Eventually(t, func() bool { return running.Load() == 2 && held() == 5 }, 10*time.Second, 10*time.Millisecond,
		"the agent holds 2 running and 3 prefetched jobs")
	// Over more than two AckWaits no waiting job is delivered again (+WPI
	// keeps it), none starts, and the agent takes no more.
	require.Never(t, func() bool {
		info, err := cons.Info(fleettest.Ctx(t, 5*time.Second))
		require.NoError(t, err)
		return info.NumRedelivered > 0 || info.NumAckPending != 5 || running.Load() != 2
	}, 2500*time.Millisecond, 50*time.Millisecond)
	close(release)
	for i := range 7 {
		ev := f.events.WaitFor(t, 10*time.Second, fmt.Sprintf("pf-%d", i), protocol.EventSucceeded)
		assert.Equal(t, uint32(1), ev.GetAttempt(), "waiting spent no attempt")
	}
	assert.Equal(t, int32(2), peak.Load(), "no more handlers than the concurrency")
	mu.Lock()
	defer mu.Unlock()
	for id, late := range lateDeadlines {
		assert.Less(t, late.Abs(), time.Second, "the timeout of %s runs from its start, not its delivery", id)
	}
}

// TestStopHandsBackPrefetchedJobs: jobs waiting for a slot when a stopping
// agent's grace runs out are handed back unstarted, like running ones.
func TestStopHandsBackPrefetchedJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	var started atomic.Int32
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	a, err := agent.New(env.Env.Conn, agent.Config{Concurrency: 1, Prefetch: 2}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	must(t, a.Register("block", func(ctx context.Context, job *agent.Job) error {
		started.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}, agent.KindOptions{}))
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	for i := range 3 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("sp-%d", i), Queue: "default", Kind: "block"})
	}
	cons, err := f.js.Consumer(fleettest.Ctx(t, 5*time.Second), protocol.StreamJobs, "queue-default")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(fleettest.Ctx(t, 5*time.Second))
		require.NoError(t, err)
		return info.NumAckPending == 3 && started.Load() == 1
	}, 10*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	require.NoError(t, a.Stop(ctx))
	for i := range 3 {
		f.events.WaitFor(t, 10*time.Second, fmt.Sprintf("sp-%d", i), protocol.EventReleased)
	}
	assert.Equal(t, int32(1), started.Load(), "the prefetched jobs never started")
}

func TestKindConcurrency(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	release := make(chan struct{})
	var running, peak atomic.Int32
	f.startAgent(t, agent.Config{Concurrency: 5}, func(a *agent.Agent) {
		must(t, a.Register("capped", func(ctx context.Context, job *agent.Job) error {
			n := running.Add(1)
			if n > peak.Load() {
				peak.Store(n)
			}
			defer running.Add(-1)
			<-release
			return nil
		}, agent.KindOptions{Concurrency: 2}))
	})
	for i := range 4 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("k-%d", i), Queue: "default", Kind: "capped"})
	}
	require.Eventually(t, func() bool { return running.Load() == 2 }, 10*time.Second, 10*time.Millisecond)
	close(release)
	for i := range 4 {
		f.events.WaitFor(t, 10*time.Second, fmt.Sprintf("k-%d", i), protocol.EventSucceeded)
	}
	assert.Equal(t, int32(2), peak.Load())
}

func TestHeartbeatsListInFlightJobs(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	hbs := make(chan *jetfleetpb.Heartbeat, 100)
	sub, err := f.nc.Subscribe(protocol.HeartbeatsSubjects, func(m *nats.Msg) {
		var hb jetfleetpb.Heartbeat
		if assert.NoError(t, protocol.Unmarshal(m.Data, &hb)) {
			select {
			case hbs <- &hb:
			default:
			}
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	release := make(chan struct{})
	a := f.startAgent(t, agent.Config{ID: "hb-agent", HeartbeatInterval: 100 * time.Millisecond, StartedEventAfter: 200 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("hold", func(ctx context.Context, job *agent.Job) error {
			<-release
			return nil
		}, agent.KindOptions{Timeout: time.Minute}))
	})
	defer close(release)
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "h-1", Queue: "default", Kind: "hold"})
	f.events.WaitFor(t, 10*time.Second, "h-1", protocol.EventStarted) // the hold runs past started_event_after
	var hb *jetfleetpb.Heartbeat
	for hb = range hbs {
		if len(hb.GetJobs()) == 1 {
			break
		}
	}
	assert.Equal(t, a.ID(), hb.GetAgentId())
	assert.Equal(t, []string{"hold"}, hb.GetKinds())
	assert.Equal(t, 100*time.Millisecond, hb.GetInterval().AsDuration())
	j := hb.GetJobs()[0]
	assert.Equal(t, "h-1", j.GetJobId())
	assert.Equal(t, seq, j.GetStreamSequence())
	ack, err := protocol.ParseAckSubject(j.GetReplySubject())
	require.NoError(t, err, "the reply subject is an ack subject")
	assert.Equal(t, seq, ack.StreamSequence)
	assert.WithinDuration(t, j.GetStartedAt().AsTime().Add(time.Minute), j.GetDeadline().AsTime(), time.Second)

	kv, err := f.js.KeyValue(fleettest.Ctx(t, 5*time.Second), protocol.BucketAgents)
	require.NoError(t, err)
	entry, err := kv.Get(fleettest.Ctx(t, 5*time.Second), a.ID())
	require.NoError(t, err, "the agent registers itself")
	var reg jetfleetpb.Heartbeat
	require.NoError(t, protocol.Unmarshal(entry.Value(), &reg))
	assert.Equal(t, []string{"default"}, reg.GetQueues())
}

func TestGracefulStopHandsBackRunningJobsAtOnce(t *testing.T) {
	t.Parallel()
	// AckWait is long: if the stopping agent did not hand the jobs back,
	// nobody else would see them for a minute.
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: time.Minute}}})
	startedOnFirst := make(chan string, 10)
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	first, err := agent.New(env.Env.Conn, agent.Config{ID: "first", Concurrency: 5}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	must(t, first.Register("stubborn", func(ctx context.Context, job *agent.Job) error {
		startedOnFirst <- job.ID
		<-ctx.Done() // runs until the agent hands it back
		return ctx.Err()
	}, agent.KindOptions{}))
	require.NoError(t, first.Start(fleettest.Ctx(t, 10*time.Second)))
	for i := range 3 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("g-%d", i), Queue: "default", Kind: "stubborn"})
	}
	for range 3 {
		<-startedOnFirst
	}

	var mu sync.Mutex
	doneOnSecond := map[string]int{}
	f.startAgent(t, agent.Config{ID: "second"}, func(a *agent.Agent) {
		must(t, a.Register("stubborn", func(ctx context.Context, job *agent.Job) error {
			mu.Lock()
			doneOnSecond[job.ID] = job.Attempt
			mu.Unlock()
			return nil
		}, agent.KindOptions{}))
	})

	// The grace leaves Stop a second to hand back, flush and deregister,
	// however loaded the machine.
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stopped := time.Now()
	require.NoError(t, first.Stop(stopCtx))
	for i := range 3 {
		f.events.WaitFor(t, 10*time.Second, fmt.Sprintf("g-%d", i), protocol.EventSucceeded)
	}
	assert.Less(t, time.Since(stopped), 10*time.Second, "redelivered at once, not after AckWait")
	mu.Lock()
	defer mu.Unlock()
	for id, attempt := range doneOnSecond {
		assert.Equal(t, 1, attempt, "a hand-back does not spend an attempt (%s)", id)
	}
	assert.Len(t, doneOnSecond, 3)
}

func TestTraceContinuesPublisherSpan(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	a, err := agent.New(env.Env.Conn, agent.Config{}, agent.WithEnv(env.Env))
	require.NoError(t, err)
	must(t, a.Register("echo", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })

	ctx, span := env.Telemetry.TracerProvider.Tracer("publisher").Start(context.Background(), "publish")
	h := nats.Header{}
	telemetry.Inject(ctx, h)
	span.End()
	fleettest.Publish(t, f.js, protocol.Job{ID: "tr-1", Queue: "default", Kind: "echo", Header: h})
	ev := f.events.WaitFor(t, 10*time.Second, "tr-1", protocol.EventSucceeded)
	assert.Equal(t, span.SpanContext().TraceID().String(), ev.GetTraceId())
	require.Eventually(t, func() bool {
		for _, s := range env.Spans.GetSpans() {
			if s.Name == "agent.execute echo" && s.Parent.SpanID() == span.SpanContext().SpanID() {
				return true
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "the execution span is a child of the publish span")
}

func TestStartFailsWithoutKinds(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	a, err := agent.New(f.env.Env.Conn, agent.Config{}, agent.WithEnv(f.env.Env))
	require.NoError(t, err)
	assert.ErrorContains(t, a.Start(context.Background()), "no job kinds")
	require.NoError(t, a.Stop(context.Background()))
	_, err = agent.New(f.env.Env.Conn, agent.Config{Concurrency: -1, Queues: []string{"a.b"}}, agent.WithEnv(f.env.Env))
	assert.ErrorContains(t, err, "agent.concurrency")
	assert.ErrorContains(t, err, "agent.queues")
}

// TestRegisterAfterStartIsRefused: the kinds are read without a lock once
// the agent runs, so a kind registered after Start is an error, and the
// agent runs the kinds it started with.
func TestRegisterAfterStartIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	a, err := agent.New(f.env.Env.Conn, agent.Config{ID: "late"}, agent.WithEnv(f.env.Env))
	require.NoError(t, err)
	require.NoError(t, a.Register("early", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	require.NoError(t, a.Start(context.Background()))
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	err = a.Register("late", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{})
	assert.EqualError(t, err, `agent: register kind "late" before Start: agent late already started`)
	assert.ErrorContains(t, agent.AddHandler(a, func(context.Context, *agent.Job, lateArgs) error { return nil }),
		"before Start")
	assert.Equal(t, []string{"early"}, a.Kinds())
}

type lateArgs struct{}

func (lateArgs) Kind() string { return "late-typed" }

// TestMetricsCountJobsByOutcome reads the agent's metrics as /metrics serves
// them: attempts by outcome and error code, their durations, and the jobs
// running now, summed over the agents of one process (two agents share a
// meter provider here) and back to 0, not gone, once they end.
func TestMetricsCountJobsByOutcome(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	shared := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	other := *fleettest.NewEnv(t, f.srv, f.env.Base.Topology).Env // its own connection, the shared telemetry
	other.Telemetry = shared.Telemetry
	entered, release := make(chan struct{}, 2), make(chan struct{})
	for i, env := range []*service.Env{shared.Env, &other} {
		a, err := agent.New(env.Conn, agent.Config{ID: fmt.Sprintf("metrics-%d", i), Concurrency: 1}, agent.WithEnv(env))
		require.NoError(t, err)
		must(t, a.Register("block", func(ctx context.Context, _ *agent.Job) error {
			entered <- struct{}{}
			<-release
			return nil
		}, agent.KindOptions{}))
		must(t, a.Register("refuse", func(context.Context, *agent.Job) error {
			return agent.NonRetryable(errors.New("no"))
		}, agent.KindOptions{}))
		require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
		t.Cleanup(func() { assert.NoError(t, a.Stop(fleettest.Ctx(t, 10*time.Second))) })
	}
	metric := func(name string, labels map[string]string) (float64, bool) {
		t.Helper()
		families, err := shared.Telemetry.Registry.Gather()
		require.NoError(t, err)
		for _, mf := range families {
			if mf.GetName() != name {
				continue
			}
		series:
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
						continue series
					}
				}
				switch {
				case m.GetHistogram() != nil:
					return float64(m.GetHistogram().GetSampleCount()), true
				case m.GetCounter() != nil:
					return m.GetCounter().GetValue(), true
				default:
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}

	for i := range 2 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("m-%d", i), Queue: "default", Kind: "block"})
	}
	<-entered
	<-entered
	running, ok := metric("jetfleet_agent_jobs_running", map[string]string{"queue": "default", "kind": "block"})
	require.True(t, ok)
	assert.Equal(t, 2.0, running, "one job on each agent, summed")
	close(release)
	fleettest.Publish(t, f.js, protocol.Job{ID: "m-refused", Queue: "default", Kind: "refuse"})
	for _, id := range []string{"m-0", "m-1"} {
		f.events.WaitFor(t, 10*time.Second, id, protocol.EventSucceeded)
	}
	f.events.WaitFor(t, 10*time.Second, "m-refused", protocol.EventDead)

	// The middleware records an attempt once its job is settled, just after
	// its last event: wait for the counts rather than read them once.
	succeeded := map[string]string{"queue": "default", "kind": "block", "outcome": protocol.EventSucceeded, "error_code": ""}
	failed := map[string]string{"queue": "default", "kind": "refuse", "outcome": protocol.EventFailed, "error_code": protocol.CodeNonRetryable}
	require.Eventually(t, func() bool {
		s, _ := metric("jetfleet_agent_jobs_total", succeeded)
		f, _ := metric("jetfleet_agent_jobs_total", failed)
		return s == 2 && f == 1
	}, 10*time.Second, 10*time.Millisecond, "attempts by outcome and error code")
	durations, ok := metric("jetfleet_agent_job_duration_seconds", map[string]string{"kind": "block", "outcome": protocol.EventSucceeded})
	require.True(t, ok)
	assert.Equal(t, 2.0, durations, "one duration per attempt")
	require.Eventually(t, func() bool {
		running, ok := metric("jetfleet_agent_jobs_running", map[string]string{"queue": "default", "kind": "block"})
		return ok && running == 0
	}, 10*time.Second, 10*time.Millisecond, "back to 0 and still reported")
}

// TestCancelWhileWaitingForTheKindsSlotIsNoSuccess: a job waiting for its
// kind's concurrency slot is cancelled before its handler ever runs. It
// ends cancelled — never recorded as succeeded — and the
// agent answers the supervisor's ping as a known command.
func TestCancelWhileWaitingForTheKindsSlotIsNoSuccess(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	release := make(chan struct{})
	defer close(release)
	var ran atomic.Int32
	a := f.startAgent(t, agent.Config{Concurrency: 4}, func(a *agent.Agent) {
		must(t, a.Register("single", func(ctx context.Context, job *agent.Job) error {
			ran.Add(1)
			<-release
			return nil
		}, agent.KindOptions{Concurrency: 1}))
	})
	send := func(cmd *jetfleetpb.AgentCommand) error {
		data, err := protocol.Marshal(cmd)
		require.NoError(t, err)
		reply, err := f.nc.Request(protocol.ControlSubject(a.ID()), data, 5*time.Second)
		require.NoError(t, err)
		var doc jetfleetpb.Error
		require.NoError(t, protocol.Unmarshal(reply.Data, &doc))
		return protocol.FromDoc(&doc)
	}
	require.NoError(t, send(&jetfleetpb.AgentCommand{Action: protocol.CommandPing}), "ping is a known command")

	fleettest.Publish(t, f.js, protocol.Job{ID: "holder", Queue: "default", Kind: "single"})
	require.Eventually(t, func() bool { return ran.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	fleettest.Publish(t, f.js, protocol.Job{ID: "waiter", Queue: "default", Kind: "single"})
	require.Eventually(t, func() bool {
		return send(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: "waiter"}) == nil
	}, 10*time.Second, 10*time.Millisecond, "the waiting job is held by the agent")

	cancelled := f.events.WaitFor(t, 10*time.Second, "waiter", protocol.EventCancelled)
	assert.Equal(t, protocol.ReasonCancelled, cancelled.GetReason())
	assert.Zero(t, countEvents(f.events, "waiter", protocol.EventSucceeded), "a job that never ran succeeded")
	assert.Equal(t, int32(1), ran.Load(), "the cancelled job's handler ran")
}

func countEvents(e *fleettest.Events, jobID, typ string) int {
	n := 0
	for _, ev := range e.All() {
		if ev.GetJobId() == jobID && ev.GetType() == typ {
			n++
		}
	}
	return n
}

// TestIdleQueueLeavesItsSlotsToABusyOne: an agent serving two queues, one
// of them idle, runs every job of the busy one, as many at once as its
// slots allow less the idle queue's single probe, while the idle queue's
// requests expire every 200 ms (its slots went back to the busy queue).
func TestIdleQueueLeavesItsSlotsToABusyOne(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	const jobs = 300
	var running, most atomic.Int32
	var late atomic.Int32 // the most running at once after the 100th job
	var started atomic.Int32
	f.startAgent(t, agent.Config{Concurrency: 4, Queues: []string{"idle", "default"}, FetchMaxWait: 200 * time.Millisecond},
		func(a *agent.Agent) {
			must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
				n := running.Add(1)
				defer running.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if started.Add(1) > 100 {
					for m := late.Load(); n > m && !late.CompareAndSwap(m, n); m = late.Load() {
					}
				}
				time.Sleep(20 * time.Millisecond) // the work
				return nil
			}, agent.KindOptions{}))
		})
	for i := range jobs {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("j-%d", i), Queue: "default", Kind: "work"})
	}
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 60*time.Second)
	assert.GreaterOrEqual(t, late.Load(), int32(3), "every slot but (at most) the idle queue's probe runs the busy queue's jobs")
	assert.LessOrEqual(t, most.Load(), int32(4))
}

// TestHigherPriorityJobsStartFirst: with high, default and low jobs
// waiting, an agent starts the high ones first and the low ones last — yet
// some low jobs start while high ones still wait (a low priority gets a
// share of the slots, so it never starves).
func TestHigherPriorityJobsStartFirst(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, 60*time.Second)
	_, err := topology.EnsureQueue(ctx, f.js, topology.Config{}, "default")
	require.NoError(t, err)
	const perPriority = 150
	for i := range perPriority {
		for _, p := range protocol.Priorities {
			fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("%s-%d", p, i), Queue: "default", Kind: "work", Priority: p})
		}
	}
	var mu sync.Mutex
	var order []string // priorities in start order
	// Every priority keeps one slot open for its next job (its probe), and
	// only the rest are shared by weight: with 4 slots default and low each
	// got about one, and their medians crossed under CI load. With 16 the
	// weights decide most starts.
	f.startAgent(t, agent.Config{Concurrency: 16}, func(a *agent.Agent) {
		must(t, a.Register("work", func(_ context.Context, job *agent.Job) error {
			mu.Lock()
			order = append(order, strings.SplitN(job.ID, "-", 2)[0])
			mu.Unlock()
			time.Sleep(time.Millisecond) // the work
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 60*time.Second)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, order, 3*perPriority)
	median := func(p string) int {
		var at []int
		for i, q := range order {
			if q == p {
				at = append(at, i)
			}
		}
		return at[len(at)/2]
	}
	t.Logf("median start positions of %d: high %d, default %d, low %d", len(order), median(protocol.PriorityHigh),
		median(protocol.PriorityDefault), median(protocol.PriorityLow))
	assert.Less(t, median(protocol.PriorityHigh), median(protocol.PriorityDefault), "high before default")
	assert.Less(t, median(protocol.PriorityDefault), median(protocol.PriorityLow), "default before low")
	lastHigh := slices.Index(order, protocol.PriorityHigh)
	for i, q := range order {
		if q == protocol.PriorityHigh {
			lastHigh = i
		}
	}
	assert.Contains(t, order[:lastHigh], protocol.PriorityLow, "a low job started while high ones waited")
}
