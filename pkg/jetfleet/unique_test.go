package jetfleet_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

type uniqueBundle struct {
	js     jetstream.JetStream
	client *jetfleet.Client
	ctx    context.Context
}

// setupUnique is a provisioned JetStream server (no services: nothing
// consumes the jobs) and a client.
func setupUnique(t *testing.T) *uniqueBundle {
	t.Helper()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	ctx := fleettest.Ctx(t, 30*time.Second)
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))
	return &uniqueBundle{js: js, client: jetfleet.NewClient(nc), ctx: ctx}
}

func (b *uniqueBundle) jobsStored(t *testing.T) uint64 {
	t.Helper()
	s, err := b.js.Stream(b.ctx, protocol.StreamJobs)
	require.NoError(t, err)
	return s.CachedInfo().State.Msgs
}

// TestUniqueDuplicateWithinPeriod: a second job of the key within its
// period stores nothing and returns the first job's id — across job ids,
// across EnqueueMany, not across queues or kinds.
func TestUniqueDuplicateWithinPeriod(t *testing.T) {
	t.Parallel()
	b := setupUnique(t)
	first, err := b.client.Enqueue(b.ctx, SendEmail{To: "ada@example.com"}, jetfleet.WithUniqueFor("welcome:ada", time.Hour))
	require.NoError(t, err)
	assert.False(t, first.Duplicate)
	assert.NotZero(t, first.Sequence)

	again, err := b.client.Enqueue(b.ctx, SendEmail{To: "ada@example.com"}, jetfleet.WithUniqueFor("welcome:ada", time.Hour),
		jetfleet.WithJobID("another-id"))
	require.NoError(t, err)
	assert.True(t, again.Duplicate)
	assert.Equal(t, first.JobID, again.JobID, "the existing job's id")
	assert.Zero(t, again.Sequence)

	// Until-finished and a period share the key.
	again, err = b.client.Enqueue(b.ctx, SendEmail{}, jetfleet.WithUniqueUntilFinished("welcome:ada"))
	require.NoError(t, err)
	assert.True(t, again.Duplicate)

	results, err := b.client.EnqueueMany(b.ctx, []jetfleet.EnqueueParams{
		{Args: SendEmail{}, Options: []jetfleet.EnqueueOption{jetfleet.WithUniqueFor("welcome:ada", time.Hour)}},
		{Args: SendEmail{}, Options: []jetfleet.EnqueueOption{jetfleet.WithUniqueFor("welcome:bob", time.Hour)}},
		{Args: SendEmail{}, Options: []jetfleet.EnqueueOption{jetfleet.WithUniqueFor("welcome:bob", time.Hour)}},
		// Another queue is another key space.
		{Args: SendEmail{}, Options: []jetfleet.EnqueueOption{jetfleet.WithUniqueFor("welcome:ada", time.Hour), jetfleet.WithQueue("other")}},
	})
	require.NoError(t, err)
	for i, r := range results {
		require.NoError(t, r.Err, i)
	}
	assert.True(t, results[0].Duplicate)
	assert.Equal(t, first.JobID, results[0].JobID)
	assert.False(t, results[1].Duplicate)
	assert.True(t, results[2].Duplicate)
	assert.Equal(t, results[1].JobID, results[2].JobID)
	assert.False(t, results[3].Duplicate)
	assert.Equal(t, uint64(3), b.jobsStored(t), "first, bob's and the other queue's")

	// The job names its claim, for anyone reading it.
	s, err := b.js.Stream(b.ctx, protocol.StreamJobs)
	require.NoError(t, err)
	m, err := s.GetMsg(b.ctx, first.Sequence)
	require.NoError(t, err)
	assert.Equal(t, protocol.UniqueClaimKey("emails", "send-email", "welcome:ada"), m.Header.Get(protocol.HeaderUniqueKey))
}

// TestUniqueAcceptedAfterPeriod: once the period is over, the key takes a
// new job (the claim's per-key TTL ran out).
func TestUniqueAcceptedAfterPeriod(t *testing.T) {
	t.Parallel()
	b := setupUnique(t)
	const period = time.Second // JetStream's shortest TTL
	start := time.Now()
	first, err := b.client.Enqueue(b.ctx, SendEmail{}, jetfleet.WithUniqueFor("k", period))
	require.NoError(t, err)
	var next *jetfleet.EnqueueResult
	// Polls until the server expires the claim: a duplicate stores nothing.
	require.Eventually(t, func() bool {
		res, err := b.client.Enqueue(b.ctx, SendEmail{}, jetfleet.WithUniqueFor("k", period))
		require.NoError(t, err)
		if res.Duplicate {
			assert.Equal(t, first.JobID, res.JobID)
			return false
		}
		next = res
		return true
	}, 15*time.Second, 50*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), period, "held for the whole period")
	assert.NotEqual(t, first.JobID, next.JobID)
	assert.Equal(t, uint64(2), b.jobsStored(t))
}

// TestUniqueBadInput: a unique key that cannot be claimed is refused with
// an error that says why, and nothing is stored or claimed.
func TestUniqueBadInput(t *testing.T) {
	t.Parallel()
	b := setupUnique(t)
	for _, c := range []struct {
		name string
		opt  jetfleet.EnqueueOption
		want string
	}{
		{"empty key", jetfleet.WithUniqueUntilFinished(""), "unique key is empty"},
		{"negative period", jetfleet.WithUniqueFor("k", -time.Second), "unique period -1s is negative"},
		{"short period", jetfleet.WithUniqueFor("k", time.Millisecond), "shorter than a second"},
		{"no lifetime", jetfleet.WithUnique("k", jetfleet.UniqueOptions{}), "needs a period or until-finished"},
		{"long key", jetfleet.WithUniqueFor(strings.Repeat("k", protocol.MaxUniqueKeyLength+1), time.Hour), "at most 256 are allowed"},
	} {
		_, err := b.client.Enqueue(b.ctx, SendEmail{}, c.opt)
		require.Error(t, err, c.name)
		assert.ErrorContains(t, err, c.want, c.name)
		assert.True(t, errors.Is(err, protocol.Code(protocol.CodeInvalidArgument)), "%s: %v", c.name, err)
	}
	_, err := b.client.Enqueue(b.ctx, SendEmail{}, jetfleet.WithUniqueFor(strings.Repeat("k", protocol.MaxUniqueKeyLength), time.Hour))
	assert.NoError(t, err, "a key of the longest length")
	kv, err := b.js.KeyValue(b.ctx, protocol.BucketUnique)
	require.NoError(t, err)
	keys, err := kv.ListKeys(b.ctx)
	require.NoError(t, err)
	n := 0
	for range keys.Keys() {
		n++
	}
	assert.Equal(t, 2, n, "the longest key's claim and its job's hold, nothing else")
	assert.Equal(t, uint64(1), b.jobsStored(t))
}

// TestUniqueReleasedWhenNotStored: a job JetStream refuses gives its key
// back at once.
func TestUniqueReleasedWhenNotStored(t *testing.T) {
	t.Parallel()
	b := setupUnique(t)
	huge := SendEmail{Subject: strings.Repeat("x", 600<<10)} // over max_job_size (512 KiB), under max_payload
	_, err := b.client.Enqueue(b.ctx, huge, jetfleet.WithUniqueUntilFinished("k"))
	require.Error(t, err)
	require.True(t, errors.Is(err, protocol.Code(protocol.CodeInvalidArgument)), "JetStream refused it: %v", err)
	res, err := b.client.Enqueue(b.ctx, SendEmail{}, jetfleet.WithUniqueUntilFinished("k"))
	require.NoError(t, err)
	assert.False(t, res.Duplicate, "the refused job's claim was released")
}
