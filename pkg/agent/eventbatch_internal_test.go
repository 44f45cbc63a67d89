package agent

import (
	"context"
	"fmt"
	"hash/crc32"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// batchModes runs test with fast batches and with atomic ones.
func batchModes(t *testing.T, test func(t *testing.T, atomic bool)) {
	for _, atomic := range []bool{false, true} {
		t.Run(map[bool]string{false: "fast", true: "atomic"}[atomic], func(t *testing.T) {
			t.Parallel()
			test(t, atomic)
		})
	}
}

// TestEventsGoOutInBatches: on an events stream that takes fast or atomic
// batches, every event is stored and the server answers a few times per
// batch, not once per event.
func TestEventsGoOutInBatches(t *testing.T) {
	t.Parallel()
	batchModes(t, testEventsGoOutInBatches)
}

func testEventsGoOutInBatches(t *testing.T, atomic bool) {
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	require.NoError(t, topology.Ensure(fleettest.Ctx(t, 10*time.Second), js, eventsTopology(atomic, 1)))
	r, _ := startBatchingRecorder(t, nc, js, atomic)

	const n = 2000
	answersBefore := nc.Stats().InMsgs
	for i := range n {
		r.event(succeededEvent(fmt.Sprintf("j-%d", i)))
	}
	require.NoError(t, r.flush(fleettest.Ctx(t, 20*time.Second)))

	assert.Equal(t, uint64(n), eventsStored(t, js).State.NumSubjects, "every job's event is stored")
	answers := nc.Stats().InMsgs - answersBefore
	assert.Less(t, answers, uint64(n/10), "the server answered batches, not events")
}

// TestBatchEventsAfterAGapAreSentAgain: a batch whose second message never
// reached the server is ended by the server — a fast batch ("gap: fail")
// after its first event, an atomic one with nothing stored; the events it
// did not store are sent again one by one.
func TestBatchEventsAfterAGapAreSentAgain(t *testing.T) {
	t.Parallel()
	batchModes(t, testBatchEventsAfterAGapAreSentAgain)
}

func testBatchEventsAfterAGapAreSentAgain(t *testing.T, atomic bool) {
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	require.NoError(t, topology.Ensure(fleettest.Ctx(t, 10*time.Second), js, eventsTopology(atomic, 1)))
	r, b := startBatchingRecorder(t, nc, js, atomic)
	b.window = time.Hour // one batch for the whole test, committed by flush

	r.event(succeededEvent("j-1"))
	// The second message of the batch is lost on its way: it is counted in
	// the batch as sent, but the server never sees it.
	lost := pendingFor(t, r, succeededEvent("j-2"))
	b.mu.Lock()
	b.current.events = append(b.current.events, lost)
	b.mu.Unlock()
	r.event(succeededEvent("j-3")) // the server sees sequence 3 after 1
	require.NoError(t, r.flush(fleettest.Ctx(t, 20*time.Second)))

	info := eventsStored(t, js)
	assert.Equal(t, uint64(3), info.State.NumSubjects, "the lost event and the one after the gap were sent again")
	assert.Equal(t, uint64(3), info.State.Msgs, "the stored event was not sent twice")
}

// TestRefusedBatchesFallBackToEventsOneByOne: a stream that takes no
// batches of the kind sent refuses the first; its events are sent one by
// one, and so are the next ones for a while.
func TestRefusedBatchesFallBackToEventsOneByOne(t *testing.T) {
	t.Parallel()
	batchModes(t, testRefusedBatchesFallBackToEventsOneByOne)
}

func testRefusedBatchesFallBackToEventsOneByOne(t *testing.T, atomic bool) {
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	ctx := fleettest.Ctx(t, 20*time.Second)
	require.NoError(t, topology.Ensure(ctx, js, eventsTopology(atomic, 1)))
	s, err := js.Stream(ctx, protocol.StreamEvents)
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.AllowBatchPublish, cfg.AllowAtomicPublish = false, false
	_, err = js.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	r, b := startBatchingRecorder(t, nc, js, atomic)

	for i := range 20 {
		r.event(succeededEvent(fmt.Sprintf("j-%d", i)))
	}
	require.NoError(t, r.flush(ctx))

	assert.Equal(t, uint64(20), eventsStored(t, js).State.NumSubjects)
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.True(t, time.Now().Before(b.pausedUntil), "batching is paused after the refusal")
}

// TestBatchedEventsSurviveAnEventsLeaderChange: on a three-node cluster
// the events stream's leader steps down while an agent's batches go out;
// every event is stored in the end (some perhaps twice), none lost.
func TestBatchedEventsSurviveAnEventsLeaderChange(t *testing.T) {
	t.Parallel()
	batchModes(t, testBatchedEventsSurviveAnEventsLeaderChange)
}

func testBatchedEventsSurviveAnEventsLeaderChange(t *testing.T, atomic bool) {
	cluster := natstest.StartCluster(t, 3)
	nc := natstest.ConnectURL(t, cluster.URLs())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := fleettest.Ctx(t, 60*time.Second)
	require.NoError(t, topology.Ensure(ctx, js, eventsTopology(atomic, 3)))
	r, _ := startBatchingRecorder(t, nc, js, atomic)

	const n = 3000
	for i := range n {
		if i == n/3 {
			_, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+protocol.StreamEvents, nil, 5*time.Second)
			require.NoError(t, err)
		}
		r.event(succeededEvent(fmt.Sprintf("j-%d", i)))
	}
	require.NoError(t, r.flush(ctx))

	require.Eventually(t, func() bool {
		s, err := js.Stream(ctx, protocol.StreamEvents)
		return err == nil && s.CachedInfo().State.NumSubjects == n
	}, 30*time.Second, 50*time.Millisecond, "every job's event is stored")
}

// startBatchingRecorder starts a recorder that publishes in batches —
// atomic or fast ones — as an agent does on a stream that takes them.
func startBatchingRecorder(t *testing.T, nc *nats.Conn, js jetstream.JetStream, atomic bool) (*recorder, *eventBatches) {
	t.Helper()
	r := startRecorder(t, nc, js)
	b, err := newEventBatches(nc, protocol.EventBatchCommitSubject("test-agent"), atomic, fleettest.Logger(t))
	require.NoError(t, err)
	r.batches = b
	ctx, cancel := context.WithCancel(context.Background())
	go b.expireLoop(ctx)
	t.Cleanup(cancel)
	return r, b
}

// succeededEvent is the succeeded event of the first delivery of job id; its
// stream sequence is made from the id, so each job has its own message id.
func succeededEvent(jobID string) *jetfleetpb.JobEvent {
	seq := crc32.ChecksumIEEE([]byte(jobID)) | 1
	return &jetfleetpb.JobEvent{Type: protocol.EventSucceeded, JobId: jobID, Queue: "default", Kind: "echo", Attempt: 1,
		StreamSequence: uint64(seq), Delivered: 1}
}

// pendingFor makes the pending event r would publish for ev, counted in
// flight as publish counts it.
func pendingFor(t *testing.T, r *recorder, ev *jetfleetpb.JobEvent) *pendingEvent {
	t.Helper()
	msg, err := eventMsg(ev, "")
	require.NoError(t, err)
	job := protocol.JobToken(ev.GetJobId())
	e := &pendingEvent{r: r, msg: msg, job: job, number: r.next(job), tries: 1}
	r.inflight.Add(1)
	return e
}

func eventsStored(t *testing.T, js jetstream.JetStream) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(fleettest.Ctx(t, 5*time.Second), protocol.StreamEvents)
	require.NoError(t, err)
	return s.CachedInfo()
}

// TestResentEventsAreStoredOnce: a batch is stored but its answers never
// reach the agent, which sends its events again one by one; some events
// were even stored before the batch. Every event carries its own message
// id, so the stream keeps each once.
func TestResentEventsAreStoredOnce(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	ctx := fleettest.Ctx(t, 30*time.Second)
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))
	r, b := startBatchingRecorder(t, nc, js, false)
	b.window = time.Hour // one batch, committed below

	const n = 100
	for i := range 10 { // stored before, one by one
		require.NoError(t, r.eventNow(ctx, succeededEvent(fmt.Sprintf("j-%d", i))))
	}
	require.NoError(t, b.sub.Unsubscribe()) // the batch's answers are lost
	for i := range n {
		r.event(succeededEvent(fmt.Sprintf("j-%d", i)))
	}
	b.commitNow()
	require.Eventually(t, func() bool { return eventsStored(t, js).State.Msgs >= n }, 10*time.Second, 10*time.Millisecond,
		"the batch is stored")
	b.expire(time.Now().Add(2 * asyncTimeout)) // unanswered: sent again one by one
	require.NoError(t, r.flush(ctx))

	info := eventsStored(t, js)
	assert.Equal(t, uint64(n), info.State.NumSubjects)
	assert.Equal(t, uint64(n), info.State.Msgs, "a resent event was stored twice")
}

// TestAtomicBatchHoldingAnEventStoredBeforeIsSentOneByOne: an atomic batch
// in which some events were stored before (sent again after a lost answer)
// is refused whole; its events are sent one by one, each stored once, and
// batching goes on (a duplicate is one event's matter, not the stream's).
func TestAtomicBatchHoldingAnEventStoredBeforeIsSentOneByOne(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	ctx := fleettest.Ctx(t, 30*time.Second)
	require.NoError(t, topology.Ensure(ctx, js, eventsTopology(true, 1)))
	r, b := startBatchingRecorder(t, nc, js, true)
	b.window = time.Hour // one batch, committed by flush

	const n = 100
	for i := range 10 { // stored before, one by one
		require.NoError(t, r.eventNow(ctx, succeededEvent(fmt.Sprintf("j-%d", i))))
	}
	for i := range n {
		r.event(succeededEvent(fmt.Sprintf("j-%d", i)))
	}
	require.NoError(t, r.flush(ctx))

	info := eventsStored(t, js)
	assert.Equal(t, uint64(n), info.State.NumSubjects, "every event is stored")
	assert.Equal(t, uint64(n), info.State.Msgs, "none twice")
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.False(t, time.Now().Before(b.pausedUntil), "batching is not paused for a duplicate")
}

// eventsTopology is the layout of a test whose events go in atomic batches
// or fast ones, on replicas servers.
func eventsTopology(atomic bool, replicas int) topology.Config {
	c := topology.Config{Replicas: replicas}
	if atomic {
		c.EventBatches = topology.EventBatchesAtomic
	}
	return c
}
