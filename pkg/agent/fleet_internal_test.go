package agent

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// An agent that registered a moment ago, before the watch delivered it,
// is found by reading the bucket: its kind's job is passed on to it, not
// dead-lettered as unknown.
func TestConfirmedRunnerOfReadsTheBucketBeforeSayingNo(t *testing.T) {
	_, js := natstest.JetStream(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "agents-test"})
	require.NoError(t, err)

	var runner lifecycle.Runner
	_, err = runner.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = runner.Stop(context.Background()) }()
	view := newFleetView(js, kv, "self", slog.New(slog.DiscardHandler))
	view.runner = &runner // started, but never watching: every registration comes from a read

	assert.Empty(t, view.confirmedRunnerOf(ctx, "default", "count-rows"), "nobody runs it")

	register := func(id string, kinds ...string) {
		hb, err := protocol.Marshal(&jetfleetpb.Heartbeat{AgentId: id, Queues: []string{"default"}, Kinds: kinds})
		require.NoError(t, err)
		_, err = kv.Put(ctx, id, hb)
		require.NoError(t, err)
	}
	register("self", "echo")
	register("newcomer", "count-rows")
	assert.Empty(t, view.runnerOf("default", "count-rows"), "the watched view has not seen it")

	// Many jobs of the kind at once share a few reads of the bucket.
	var wg sync.WaitGroup
	found := make([]string, 50)
	for i := range found {
		wg.Go(func() { found[i] = view.confirmedRunnerOf(ctx, "default", "count-rows") })
	}
	wg.Wait()
	for i, id := range found {
		assert.Equal(t, "newcomer", id, "call %d", i)
	}
	assert.Empty(t, view.confirmedRunnerOf(ctx, "other", "count-rows"), "not on that queue")
}
