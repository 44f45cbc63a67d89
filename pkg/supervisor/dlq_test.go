package supervisor_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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

// TestReplayRunsDeadLetterAgainAndPurgeRemovesIt: a job fails for good,
// is replayed (same payload and headers, same job id, a fresh attempt,
// Jetfleet-Replayed-From) and succeeds; replaying the same letter again
// publishes nothing; purging removes it.
func TestReplayRunsDeadLetterAgainAndPurgeRemovesIt(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	var healthy atomic.Bool
	type run struct {
		attempt      int
		replayedFrom string
		tenant       string
		payload      string
	}
	var mu sync.Mutex
	var runs []run
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("charge", func(_ context.Context, job *agent.Job) error {
			mu.Lock()
			runs = append(runs, run{job.Attempt, job.ReplayedFrom, job.Headers.Get("X-Tenant"), string(job.Payload)})
			mu.Unlock()
			if !healthy.Load() {
				return agent.NonRetryable(errors.New("card declined"))
			}
			return nil
		}, agent.KindOptions{}))
		must(t, a.Register("other", func(context.Context, *agent.Job) error {
			return agent.NonRetryable(errors.New("nope"))
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "charge-1", Queue: "default", Kind: "charge", Payload: []byte(`{"cents":500}`),
		Header: nats.Header{"X-Tenant": {"acme"}}})
	fleettest.Publish(t, f.js, protocol.Job{ID: "other-1", Queue: "default", Kind: "other"})
	f.events.WaitFor(t, 10*time.Second, "charge-1", protocol.EventDead)
	f.events.WaitFor(t, 10*time.Second, "other-1", protocol.EventDead)
	ctx := fleettest.Ctx(t, 30*time.Second)

	all, err := f.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{})
	require.NoError(t, err)
	require.Len(t, all.Letters, 2)
	list, err := f.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{DLQFilter: jetfleet.DLQFilter{Kind: "charge", Reason: protocol.ReasonNonRetryable}})
	require.NoError(t, err)
	require.Len(t, list.Letters, 1)
	letter := list.Letters[0]
	assert.Equal(t, "charge-1", letter.JobID)
	assert.Equal(t, "card declined", letter.LastError)
	assert.Nil(t, letter.Replay)
	none, err := f.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{DLQFilter: jetfleet.DLQFilter{Since: time.Now().Add(time.Hour)}})
	require.NoError(t, err)
	assert.Empty(t, none.Letters, "nothing stored in the future")
	page, err := f.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{Limit: 1})
	require.NoError(t, err)
	require.Len(t, page.Letters, 1)
	require.NotZero(t, page.Next, "a second page")
	page2, err := f.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{Limit: 1, After: page.Next})
	require.NoError(t, err)
	require.Len(t, page2.Letters, 1)
	assert.NotEqual(t, page.Letters[0].Sequence, page2.Letters[0].Sequence)

	shown, err := f.client.DeadLetter(ctx, letter.Sequence)
	require.NoError(t, err)
	doc, err := shown.Decode()
	require.NoError(t, err)
	assert.Equal(t, []byte(`{"cents":500}`), doc.GetPayload())
	assert.Equal(t, []string{"acme"}, doc.GetHeaders()["X-Tenant"].GetValues())

	healthy.Store(true)
	res, err := f.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{Sequence: letter.Sequence})
	require.NoError(t, err)
	require.Len(t, res.Results, 1)
	replayed := res.Results[0]
	assert.False(t, replayed.AlreadyReplayed)
	ok := f.events.Wait(t, 10*time.Second, func(ev *jetfleetpb.JobEvent) bool {
		return ev.GetJobId() == "charge-1" && ev.GetType() == protocol.EventSucceeded
	})
	assert.Equal(t, replayed.JobSequence, ok.GetStreamSequence(), "a new job message")
	assert.Equal(t, uint32(1), ok.GetAttempt(), "fresh attempts")
	mu.Lock()
	require.Len(t, runs, 2)
	assert.Equal(t, run{1, "DLQ:" + strconv.FormatUint(letter.Sequence, 10), "acme", `{"cents":500}`}, runs[1])
	mu.Unlock()

	again, err := f.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{Sequence: letter.Sequence})
	require.NoError(t, err)
	assert.True(t, again.Results[0].AlreadyReplayed, "a letter is replayed once")
	assert.Equal(t, replayed.JobSequence, again.Results[0].JobSequence)
	shown, err = f.client.DeadLetter(ctx, letter.Sequence)
	require.NoError(t, err)
	require.NotNil(t, shown.Replay)
	assert.Equal(t, 1, shown.Replay.Count)

	// A filter or all is required for a bulk operation.
	_, err = f.client.PurgeDeadLetters(ctx, jetfleet.PurgeRequest{})
	assert.True(t, errors.Is(err, protocol.Code(protocol.CodeInvalidArgument)), "%v", err)
	purged, err := f.client.PurgeDeadLetters(ctx, jetfleet.PurgeRequest{Sequence: letter.Sequence})
	require.NoError(t, err)
	assert.Equal(t, 1, purged.Purged)
	_, err = f.client.DeadLetter(ctx, letter.Sequence)
	assert.True(t, errors.Is(err, protocol.Code(protocol.CodeNotFound)), "%v", err)
	purged, err = f.client.PurgeDeadLetters(ctx, jetfleet.PurgeRequest{DLQFilter: jetfleet.DLQFilter{Kind: "other"}})
	require.NoError(t, err)
	assert.Equal(t, 1, purged.Purged)
	assert.Zero(t, fleettest.StreamMsgs(t, f.js, protocol.StreamDLQ))
	mu.Lock()
	assert.Len(t, runs, 2, "the second replay request ran nothing")
	mu.Unlock()
}

// TestFilteredReplay replays the letters of a kind page by page, then
// every letter: those replayed before are skipped and do not count against
// the limit (a bulk replay never stalls on them), and force replays one
// again.
func TestFilteredReplay(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	var healthy atomic.Bool
	var succeeded atomic.Int32
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("batch", func(context.Context, *agent.Job) error {
			if !healthy.Load() {
				return agent.NonRetryable(errors.New("down"))
			}
			succeeded.Add(1)
			return nil
		}, agent.KindOptions{}))
	})
	for _, id := range []string{"b-1", "b-2", "b-3"} {
		fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "batch"})
		f.events.WaitFor(t, 10*time.Second, id, protocol.EventDead)
	}
	healthy.Store(true)
	ctx := fleettest.Ctx(t, 30*time.Second)
	filter := jetfleet.DLQFilter{Queue: "default", Kind: "batch"}
	first, err := f.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{DLQFilter: filter, Limit: 1})
	require.NoError(t, err)
	require.Len(t, first.Results, 1)
	assert.Equal(t, "b-1", first.Results[0].JobID)
	require.True(t, first.Truncated)
	require.NotZero(t, first.Next)
	second, err := f.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{DLQFilter: filter, Limit: 1, After: first.Next})
	require.NoError(t, err)
	require.Len(t, second.Results, 1)
	assert.Equal(t, "b-2", second.Results[0].JobID, "the next page")
	// Starting over: the two replayed letters are skipped, not counted.
	rest, err := f.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{All: true, Limit: 1})
	require.NoError(t, err)
	require.Len(t, rest.Results, 1)
	assert.Equal(t, "b-3", rest.Results[0].JobID)
	assert.False(t, rest.Results[0].AlreadyReplayed)
	assert.Equal(t, 2, rest.AlreadyReplayed)
	assert.False(t, rest.Truncated)
	for _, id := range []string{"b-1", "b-2", "b-3"} {
		f.events.WaitFor(t, 10*time.Second, id, protocol.EventSucceeded)
	}
	res, err := f.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{All: true})
	require.NoError(t, err)
	assert.Empty(t, res.Results)
	assert.Equal(t, 3, res.AlreadyReplayed)
	forced, err := f.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{Sequence: first.Results[0].DLQSequence, Force: true})
	require.NoError(t, err)
	assert.False(t, forced.Results[0].AlreadyReplayed)
	assert.NotEqual(t, first.Results[0].JobSequence, forced.Results[0].JobSequence)
	waitFor(t, 10*time.Second, "the forced replay to run", func() bool { return succeeded.Load() == 4 })
}
