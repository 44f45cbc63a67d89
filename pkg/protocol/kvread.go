package protocol

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ReadBucket returns the current entries of bucket kv whose keys match keys
// (a key pattern: "foo.*", ">" for every key), in the order of their
// revisions, deletions left out; with metaOnly, without their values.
//
// A watcher's nil entry ("initial values done") does not end a listing:
// when a key is rewritten while the watcher reads — a heartbeat, a run that
// advances — the server can remove the value the watcher was about to send
// and count the rewrite in no pending figure, so the nil entry comes before
// the key's new value. Lists read that way missed such keys (and came back
// empty), one listing in six in a test that rewrites three keys
// (TestReadBucketSeesKeysRewrittenWhileItReads). ReadBucket reads until
// every key the stream held once the watcher started has come (AwaitCurrent).
func ReadBucket(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, keys string, metaOnly bool) ([]jetstream.KeyValueEntry, error) {
	// The watch's subscription follows ctx until ctx ends: end it here.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var opts []jetstream.WatchOpt
	if metaOnly {
		opts = append(opts, jetstream.MetaOnly())
	}
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
// (its value aged out under the bucket's TTL, say) is no longer waited for
// once two listings in a row lack it.
//
// w must be new (nothing read from it yet), watch exactly keys, send each
// key's last value (no IncludeHistory, UpdatesOnly or ResumeFromRevision)
// and not ignore deletions: a deleted key comes as its delete marker.
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
	// answer in a moment: only ctx, or an error no retry mends, ends the
	// wait.
	waiting, err := stored()
	for err != nil {
		if permanent(err) {
			return fmt.Errorf("bucket %s: %w", bucket, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("list the keys of bucket %s: %w (%w)", bucket, ctx.Err(), err)
		case <-time.After(awaitCurrentRecheck):
		}
		waiting, err = stored()
	}
	// The next listing comes a while after the last one ended, a while
	// that grows with how long it took: a slow listing (a large bucket, a
	// busy server) must not crowd out the reading of w.
	recheck := time.NewTimer(awaitCurrentRecheck)
	defer recheck.Stop()
	absent := map[string]bool{} // keys the last listing lacked
	for len(waiting) > 0 {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return fmt.Errorf("bucket %s: %w", bucket, ctx.Err())
				}
				return fmt.Errorf("bucket %s: the watch closed while reading", bucket)
			}
			if e == nil {
				continue // the watcher's own marker, which comes too early when keys are rewritten
			}
			apply(e)
			delete(waiting, e.Key())
		case <-recheck.C:
			began := time.Now()
			now, err := stored()
			if err == nil {
				// A listing paged over a bucket that changes can skip a
				// key: only one that two listings in a row lack is gone.
				for key := range waiting {
					switch {
					case now[key]:
						delete(absent, key)
					case absent[key]:
						delete(waiting, key)
					default:
						absent[key] = true
					}
				}
			}
			recheck.Reset(max(awaitCurrentRecheck, 4*time.Since(began)))
		case <-ctx.Done():
			return fmt.Errorf("bucket %s: %w", bucket, ctx.Err())
		}
	}
	return nil
}

// permanent reports whether a listing failed for a reason that asking
// again does not mend.
func permanent(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// awaitCurrentRecheck is how long AwaitCurrent waits at least before it
// lists again the keys it still waits for, and before it asks again for a
// listing that failed; awaitCurrentAttempt bounds each ask.
const (
	awaitCurrentRecheck = 250 * time.Millisecond
	awaitCurrentAttempt = 5 * time.Second
)
