package supervisor_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestCrashLoopReachesMaxDeliverAndIsDeadLetteredOnce runs a job whose
// handler takes its agent down every time (the test cuts the agent's
// connection once a heartbeat has listed the job, as a process crashing
// in the middle of the job would).
// The supervisor rescues each delivery of the dead agents until the
// queue's max_deliver (3) is spent; the MAX_DELIVERIES advisory then
// dead-letters the job exactly once — across a supervisor restart in the
// middle of the run, and another one after it — and the work stream no
// longer holds it.
func TestCrashLoopReachesMaxDeliverAndIsDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {MaxDeliver: 3}}})
	cfg := fast(supervisor.Config{MissedHeartbeats: 3})
	_, stop1 := f.leader(t, cfg, nil)

	crashes := make(chan string, 10)
	crasher := func(id string) *testAgent {
		return f.startAgent(t, "", agent.Config{ID: id, HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
			must(t, a.Register("poison", func(ctx context.Context, job *agent.Job) error {
				crashes <- id
				<-ctx.Done()
				return ctx.Err()
			}, agent.KindOptions{}))
		})
	}
	// crash waits until the registration of a (its heartbeat in bucket
	// agents) lists the job, then kills a: a job no heartbeat listed yet is
	// only redelivered after AckWait, and a supervisor that starts after the
	// crash knows only what the registration says (the heartbeat an agent
	// sends right after a delivery is not registered).
	crash := func(a *testAgent) {
		require.Equal(t, a.ID(), <-crashes)
		waitRegistered(t, f.js, a.ID(), func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == 1 })
		a.kill()
	}
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "poison-1", Queue: "default", Kind: "poison", Payload: []byte(`{"n":1}`),
		Header: nats.Header{"X-Tenant": {"acme"}}})

	crash(crasher("crash-1"))
	crash(crasher("crash-2"))

	// The supervisor restarts while crash-2 lies dead with the job.
	stop1()
	_, stop2 := f.leader(t, cfg, nil)
	crash(crasher("crash-3"))

	var survivorRuns atomic.Int32
	f.startAgent(t, "", agent.Config{ID: "survivor", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("poison", func(context.Context, *agent.Job) error {
			survivorRuns.Add(1)
			return nil
		}, agent.KindOptions{}))
	})
	dead := f.events.WaitFor(t, 20*time.Second, "poison-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonMaxDeliveries, dead.GetReason())
	assert.Equal(t, seq, dead.GetStreamSequence())
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)

	// Another restart: the advisory was handled once; reconciliation finds nothing.
	stop2()
	s3, _ := f.leader(t, cfg, nil)
	n, err := s3.Reconcile(fleettest.Ctx(t, 10*time.Second))
	require.NoError(t, err)
	assert.Zero(t, n)

	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1, "exactly one dead letter")
	dl := letters[0]
	assert.Equal(t, "poison-1", dl.GetJobId())
	assert.Equal(t, protocol.ReasonMaxDeliveries, dl.GetReason())
	assert.Equal(t, uint32(3), dl.GetAttempts())
	assert.Equal(t, "jobs.default.poison", dl.GetOriginalSubject())
	assert.Equal(t, protocol.StreamJobs, dl.GetOriginalStream())
	assert.Equal(t, seq, dl.GetOriginalSequence())
	assert.Equal(t, []byte(`{"n":1}`), dl.GetPayload())
	assert.Equal(t, []string{"acme"}, dl.GetHeaders()["X-Tenant"].GetValues())
	assert.Equal(t, protocol.CodeAgentLost, dl.GetErrorCode())
	assert.Contains(t, dl.GetLastError(), "agent lost", "the last error comes from the job's latest event")
	assert.Empty(t, dl.GetAgentId(), "the supervisor wrote it")
	assert.Zero(t, survivorRuns.Load(), "the poison job never ran past max_deliver")
	assert.Equal(t, 3, countEvents(f.events, "poison-1", protocol.EventRescued))
	assert.Equal(t, 1, countEvents(f.events, "poison-1", protocol.EventDead))
	assert.Equal(t, protocol.EventDead, fleettest.WaitLatestEvent(t, f.js, "poison-1", protocol.EventDead, 10*time.Second).GetType())
}

// TestReconcileFindsJobsPastMaxDeliverWithoutAdvisory checks, on a real
// server, what a message past max_deliver looks like, then that the
// supervisor's reconciliation dead-letters it when no advisory was kept:
// the server sends the MAX_DELIVERIES advisory once and drops the message
// from the consumer's pending set, but the work-queue stream keeps it, at
// or below the consumer's delivered sequence.
func TestReconcileFindsJobsPastMaxDeliverWithoutAdvisory(t *testing.T) {
	t.Parallel()
	topo := topology.Config{Queues: map[string]topology.QueueConfig{"default": {MaxDeliver: 2, AckWait: time.Second}}}
	f := setup(t, topo)
	ctx := fleettest.Ctx(t, 30*time.Second)
	cons, err := topology.EnsureQueue(ctx, f.js, topo, "default")
	require.NoError(t, err)
	advisories := subscribe(t, f.nc, protocol.AdvisoryMaxDeliveriesSubjects)
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "orphan", Queue: "default", Kind: "lost"})

	for delivery := 1; delivery <= 2; delivery++ { // take it twice, never answer
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		require.NoError(t, err)
		m := <-batch.Messages()
		require.NotNil(t, m, "delivery %d", delivery)
		meta, err := m.Metadata()
		require.NoError(t, err)
		require.Equal(t, uint64(delivery), meta.NumDelivered)
	}
	// nats-server 2.15 notices max_deliver when it would deliver once more,
	// that is on a pull request after AckWait: the message is not delivered
	// and the advisory goes out instead.
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*time.Second))
	require.NoError(t, err)
	for m := range batch.Messages() {
		t.Fatalf("delivered past max_deliver: %v", m.Subject())
	}
	var adv struct {
		Type       string `json:"type"`
		StreamSeq  uint64 `json:"stream_seq"`
		Deliveries uint64 `json:"deliveries"`
	}
	require.NoError(t, json.Unmarshal(advisories.next(t, 10*time.Second).Data, &adv))
	assert.Equal(t, "io.nats.jetstream.advisory.v1.max_deliver", adv.Type)
	assert.Equal(t, seq, adv.StreamSeq)
	assert.Equal(t, uint64(2), adv.Deliveries)

	info, err := cons.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, info.NumAckPending, "no longer pending")
	assert.Equal(t, 1, info.NumRedelivered, "still counted as redelivered")
	assert.Equal(t, seq, info.Delivered.Stream)
	t.Logf("consumer after max_deliver: ack floor %d, delivered %d, ack pending %d, redelivered %d",
		info.AckFloor.Stream, info.Delivered.Stream, info.NumAckPending, info.NumRedelivered) // floor 0 on 2.15.2
	assert.Equal(t, uint64(1), fleettest.StreamMsgs(t, f.js, protocol.StreamJobs), "but the work queue keeps it")

	// The advisory is lost: ADVISORIES did not keep it.
	advStream, err := f.js.Stream(ctx, protocol.StreamAdvisories)
	require.NoError(t, err)
	require.NoError(t, advStream.Purge(ctx))

	f.leader(t, fast(supervisor.Config{}), nil) // reconciles when it becomes leader
	dead := f.events.WaitFor(t, 10*time.Second, "orphan", protocol.EventDead)
	assert.Equal(t, protocol.ReasonMaxDeliveries, dead.GetReason())
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	assert.Equal(t, "orphan", letters[0].GetJobId())
	assert.Equal(t, uint32(2), letters[0].GetAttempts())
}

// TestTerminatedAdvisoryForGoneMessageIsNoop: an agent that dead-letters a
// job TERMs it afterwards; the MSG_TERMINATED advisory then finds nothing
// left to do, and the DLQ holds the agent's one letter.
func TestTerminatedAdvisoryForGoneMessageIsNoop(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	advisories := subscribe(t, f.nc, protocol.AdvisoryTerminatedSubjects)
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("strict", func(context.Context, *agent.Job) error {
			return agent.NonRetryable(assert.AnError)
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "term-1", Queue: "default", Kind: "strict"})
	f.events.WaitFor(t, 10*time.Second, "term-1", protocol.EventDead)
	advisories.next(t, 10*time.Second)
	// The supervisor's consumer acks the advisory once handled.
	waitFor(t, 10*time.Second, "the advisory handled", func() bool {
		c, err := f.js.Consumer(fleettest.Ctx(t, 5*time.Second), protocol.StreamAdvisories, "supervisor")
		if err != nil {
			return false
		}
		info, err := c.Info(fleettest.Ctx(t, 5*time.Second))
		return err == nil && info.AckFloor.Stream >= 1 && info.NumAckPending == 0
	})
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	assert.Equal(t, protocol.ReasonNonRetryable, letters[0].GetReason())
	assert.NotEmpty(t, letters[0].GetAgentId())
	assert.Equal(t, 1, countEvents(f.events, "term-1", protocol.EventDead))
}
