package protocol

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ReadBucket returns the current entries of bucket kv whose keys match keys
// (a key pattern: "foo.*", ">" for every key), in the order of their
// revisions, deletions left out. opts go to the watcher it reads through
// (MetaOnly, say), never IgnoreDeletes: a deleted key comes as its delete
// marker, which ReadBucket needs to see.
//
// A watcher's nil entry ("initial values done") does not end a listing:
// when a key is rewritten while the watcher reads — a heartbeat, a run that
// advances — the server can remove the value the watcher was about to send
// and count the rewrite in no pending figure, so the nil entry comes before
// the key's new value. Lists read that way missed such keys (and came back
// empty), one listing in six in a test that rewrites three keys
// (TestReadBucketSeesKeysRewrittenWhileItReads). ReadBucket reads until
// every key the stream held once the watcher started has come (AwaitCurrent).
func ReadBucket(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, keys string, opts ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	w, err := kv.Watch(ctx, keys, opts...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	current := map[string]jetstream.KeyValueEntry{}
	err = AwaitCurrent(ctx, js, kv.Bucket(), keys, w, func(e jetstream.KeyValueEntry) {
		if e.Operation() == jetstream.KeyValuePut {
			current[e.Key()] = e
		} else {
			delete(current, e.Key())
		}
	})
	if err != nil {
		return nil, err
	}
	entries := make([]jetstream.KeyValueEntry, 0, len(current))
	for _, e := range current {
		entries = append(entries, e)
	}
	slices.SortFunc(entries, func(a, b jetstream.KeyValueEntry) int { return cmp.Compare(a.Revision(), b.Revision()) })
	return entries, nil
}

// AwaitCurrent applies what watcher w of bucket's keys sends, deletions and
// all, until every key the bucket held once w started has come at least
// once: then apply has seen the bucket's current state, and w goes on with
// the changes after it. The keys are those of the stream's subjects, listed
// after w started; a key that leaves the stream without a message for it
// (its value aged out under the bucket's TTL, say) is no longer waited for.
// w must not ignore deletions: a deleted key comes as its delete marker.
func AwaitCurrent(ctx context.Context, js jetstream.JetStream, bucket, keys string, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) error {
	prefix := "$KV." + bucket + "."
	var stream jetstream.Stream
	stored := func() (map[string]bool, error) {
		ctx, cancel := context.WithTimeout(ctx, awaitCurrentAttempt)
		defer cancel()
		if stream == nil {
			s, err := js.Stream(ctx, "KV_"+bucket)
			if err != nil {
				return nil, err
			}
			stream = s
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+keys))
		if err != nil {
			return nil, err
		}
		set := make(map[string]bool, len(info.State.Subjects))
		for subject := range info.State.Subjects {
			set[strings.TrimPrefix(subject, prefix)] = true
		}
		return set, nil
	}
	// A server that does not answer now (an election, a restart) may
	// answer in a moment: only ctx bounds the wait.
	waiting, err := stored()
	for err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("bucket %s: %w", bucket, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("list the keys of bucket %s: %w (%w)", bucket, ctx.Err(), err)
		case <-time.After(awaitCurrentRecheck):
		}
		waiting, err = stored()
	}
	recheck := time.NewTicker(awaitCurrentRecheck)
	defer recheck.Stop()
	for len(waiting) > 0 {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("bucket %s: the watch closed while reading", bucket)
			}
			if e == nil {
				continue // the watcher's own marker, which comes too early when keys are rewritten
			}
			apply(e)
			delete(waiting, e.Key())
		case <-recheck.C:
			// A key still waited for may have left the stream without a
			// message (TTL, purge): it will not come.
			now, err := stored()
			if err != nil {
				continue // checked again at the next tick
			}
			for key := range waiting {
				if !now[key] {
					delete(waiting, key)
				}
			}
		case <-ctx.Done():
			return fmt.Errorf("bucket %s: %w", bucket, ctx.Err())
		}
	}
	return nil
}

// awaitCurrentRecheck is how often AwaitCurrent checks that the keys it
// still waits for are stored, and how long it pauses before it asks again
// for a listing of them that failed; awaitCurrentAttempt bounds each ask.
const (
	awaitCurrentRecheck = 250 * time.Millisecond
	awaitCurrentAttempt = 5 * time.Second
)
