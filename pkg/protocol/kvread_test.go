package protocol_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// TestReadBucketSeesKeysRewrittenWhileItReads: three keys are rewritten
// without pause, and other keys made and deleted, while the bucket is read
// again and again; every reading holds the three keys, and no deleted one.
// A watcher's own "initial values done" marker missed at least one of the
// three in one reading of six here, and all of them in some.
func TestReadBucketSeesKeysRewrittenWhileItReads(t *testing.T) {
	t.Parallel()
	_, js := natstest.JetStream(t, natstest.Server(t))
	ctx := fleettest.Ctx(t, 2*time.Minute)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "runs", History: 1, TTL: time.Hour})
	require.NoError(t, err)
	rewrite := func(i int) error {
		if _, err := kv.Put(ctx, fmt.Sprintf("run%d", i%3), fmt.Appendf(nil, "%d", i)); err != nil {
			return err
		}
		if i%20 != 0 {
			return nil
		}
		intent := fmt.Sprintf("starting.%d", i)
		if _, err := kv.Put(ctx, intent, nil); err != nil {
			return err
		}
		return kv.Delete(ctx, intent)
	}
	for i := range 3 {
		require.NoError(t, rewrite(i))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 3; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := rewrite(i); err != nil {
				t.Errorf("rewrite: %v", err)
				return
			}
		}
	})
	const readings = 300
	for range readings {
		entries, err := protocol.ReadBucket(ctx, js, kv, ">", false)
		require.NoError(t, err)
		var runs, intents []string
		for _, e := range entries {
			if strings.HasPrefix(e.Key(), "run") {
				runs = append(runs, e.Key())
			} else {
				intents = append(intents, e.Key())
			}
		}
		if !assert.ElementsMatch(t, []string{"run0", "run1", "run2"}, runs) ||
			!assert.LessOrEqual(t, len(intents), 1, "only the intent under way can be current: %v", intents) {
			break
		}
	}
	close(stop)
	wg.Wait()
}

func TestReadBucketOfKeysAndOfNone(t *testing.T) {
	t.Parallel()
	_, js := natstest.JetStream(t, natstest.Server(t))
	ctx := fleettest.Ctx(t, time.Minute)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	require.NoError(t, err)
	entries, err := protocol.ReadBucket(ctx, js, kv, ">", false)
	require.NoError(t, err)
	assert.Empty(t, entries, "an empty bucket")

	for _, key := range []string{"a.1", "b.1", "a.2", "a.3"} {
		_, err := kv.PutString(ctx, key, key)
		require.NoError(t, err)
	}
	require.NoError(t, kv.Delete(ctx, "a.2"))
	require.NoError(t, kv.Purge(ctx, "a.3"))
	entries, err = protocol.ReadBucket(ctx, js, kv, "a.*", false)
	require.NoError(t, err)
	require.Len(t, entries, 1, "a deleted key and a purged one are not current")
	assert.Equal(t, "a.1", entries[0].Key())
	assert.Equal(t, "a.1", string(entries[0].Value()))

	_, err = kv.PutString(ctx, "a.1", "again")
	require.NoError(t, err)
	entries, err = protocol.ReadBucket(ctx, js, kv, ">", true)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Equal(t, []string{"b.1", "a.1"}, []string{entries[0].Key(), entries[1].Key()}, "in the order of their revisions")
	assert.Empty(t, entries[1].Value(), "MetaOnly")
}

// TestAwaitCurrentStopsWaitingForAKeyThatAgedOut: a key whose value the
// bucket's TTL removes leaves the stream without a message; a reading that
// waits for it ends once it is gone. The watcher here watches fewer keys
// than the reading lists — a misuse, on purpose — so that the key is one
// the watcher never sends.
func TestAwaitCurrentStopsWaitingForAKeyThatAgedOut(t *testing.T) {
	t.Parallel()
	_, js := natstest.JetStream(t, natstest.Server(t))
	ctx := fleettest.Ctx(t, time.Minute)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", TTL: time.Second})
	require.NoError(t, err)
	_, err = kv.PutString(ctx, "short.lived", "x")
	require.NoError(t, err)
	_, err = kv.PutString(ctx, "other.key", "y")
	require.NoError(t, err)
	w, err := kv.Watch(ctx, "other.*")
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	var applied []string
	err = protocol.AwaitCurrent(ctx, js, "b", ">", w, func(e jetstream.KeyValueEntry) { applied = append(applied, e.Key()) })
	require.NoError(t, err, "the reading ends once short.lived aged out")
	assert.Equal(t, []string{"other.key"}, applied)
	_, err = kv.Get(ctx, "short.lived")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound, "it ended because the key is gone")
}

// TestAwaitCurrentWaitsOutARestartingServer: a reading that begins while
// its server is down ends, complete, once the server is back.
func TestAwaitCurrentWaitsOutARestartingServer(t *testing.T) {
	t.Parallel()
	srv := natstest.RestartableServer(t, embedded.Options{})
	nc := natstest.ConnectURL(t, srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := fleettest.Ctx(t, time.Minute)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b"})
	require.NoError(t, err)
	for _, key := range []string{"k1", "k2"} {
		_, err := kv.PutString(ctx, key, key)
		require.NoError(t, err)
	}
	w, err := kv.WatchAll(ctx)
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	srv.Stop()
	done := make(chan error, 1)
	var applied []string
	go func() {
		done <- protocol.AwaitCurrent(ctx, js, "b", ">", w, func(e jetstream.KeyValueEntry) { applied = append(applied, e.Key()) })
	}()
	// Down for longer than one ask of the listing waits (5 s): the reading
	// asks again rather than give up.
	select {
	case err := <-done:
		t.Fatalf("the reading ended while its server was down: %v", err)
	case <-time.After(6 * time.Second):
	}
	srv.Start(t)
	require.NoError(t, <-done)
	assert.ElementsMatch(t, []string{"k1", "k2"}, applied)
}
