package jetfleet

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// UniqueOptions say how long a unique key stays claimed (WithUnique).
type UniqueOptions struct {
	// For is the period the key stays claimed from the enqueue, at least a
	// second. A job of the key that is dead-lettered or cancelled releases
	// it early — a failure never blocks the key —, one that succeeds keeps
	// it until the period ends. With UntilFinished, For is the backstop
	// instead: the longest the key is held, counted from when the job is
	// due. Defaults to 24h (protocol.DefaultUniqueBackstop) then.
	For time.Duration
	// UntilFinished holds the key until the job's run is over: it
	// succeeded, was dead-lettered or was cancelled.
	UntilFinished bool
}

// WithUnique makes the job unique by key among the jobs of its queue and
// kind, for the lifetime opts give: while the key is claimed, Enqueue of
// another job with it stores nothing and returns the job that holds it
// (EnqueueResult.Duplicate). A key is at most 256 bytes; an empty key, a
// negative period or neither a period nor UntilFinished is refused. The
// claim lives in bucket unique (docs/protocol.md §2.5) — it holds across
// restarts and failovers of every service; the supervisor leader releases
// it when the job ends.
func WithUnique(key string, opts UniqueOptions) EnqueueOption {
	return func(j *protocol.Job) {
		j.Unique = &protocol.Unique{Key: key, For: opts.For, UntilFinished: opts.UntilFinished}
	}
}

// WithUniqueFor is WithUnique(key, UniqueOptions{For: d}): at most one job
// of key per d, unless one fails.
func WithUniqueFor(key string, d time.Duration) EnqueueOption {
	return WithUnique(key, UniqueOptions{For: d})
}

// WithUniqueUntilFinished is WithUnique(key, UniqueOptions{UntilFinished:
// true}): at most one job of key at a time.
func WithUniqueUntilFinished(key string) EnqueueOption {
	return WithUnique(key, UniqueOptions{UntilFinished: true})
}

// uniqueClaim is a claim an Enqueue took, released when its job was not
// stored.
type uniqueClaim struct {
	kv             jetstream.KeyValue
	key, jobKey    string
	keyRev, jobRev uint64
}

// uniqueBucket is bucket unique, looked up on first use.
func (c *Client) uniqueBucket(ctx context.Context) (jetstream.KeyValue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unique != nil {
		return c.unique, nil
	}
	kv, err := c.js.KeyValue(ctx, protocol.BucketUnique)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "bucket %s of unique jobs: %v: is the fleet's JetStream provisioned?",
			protocol.BucketUnique, err)
	}
	c.unique = kv
	return kv, nil
}

// claimUnique claims job's unique key for it. When another job holds the
// key it returns that job's id, and no claim. A claim the job itself holds
// already (the same job enqueued again) is kept, and not returned: it is
// not this call's to release.
func (c *Client) claimUnique(ctx context.Context, job *protocol.Job) (*uniqueClaim, string, error) {
	kv, err := c.uniqueBucket(ctx)
	if err != nil {
		return nil, "", err
	}
	u := job.Unique
	claim := &uniqueClaim{kv: kv, key: protocol.UniqueClaimKey(job.Queue, job.Kind, u.Key), jobKey: protocol.UniqueJobKey(job.ID)}
	ttl := jetstream.KeyTTL(u.TTL(time.Now(), job.ProcessAt))
	fail := func(err error) error {
		return protocol.Errorf(protocol.CodeUnavailable, "enqueue %s on queue %s: claim unique key %q: %v", job.Kind, job.Queue, u.Key, err)
	}
	claimed, ours := false, false
	for range 3 {
		claim.keyRev, err = kv.Create(ctx, claim.key, []byte(job.ID), ttl)
		if err == nil {
			claimed = true
			break
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, "", fail(err)
		}
		e, gerr := kv.Get(ctx, claim.key)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			continue // released meanwhile: claim it again
		}
		if gerr != nil {
			return nil, "", fail(gerr)
		}
		if holder := string(e.Value()); holder != job.ID {
			return nil, holder, nil
		}
		ours = true // from an earlier call: its hold exists, or that call failed and released it
		break
	}
	if !claimed && !ours {
		return nil, "", fail(err)
	}
	hold := protocol.MarshalUniqueHold(protocol.UniqueHold{Key: protocol.UniqueClaimKey(job.Queue, job.Kind, u.Key), Until: u.Until()})
	if ours {
		if _, err := kv.Create(ctx, protocol.UniqueJobKey(job.ID), hold, ttl); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, "", fail(err)
		}
		return nil, "", nil
	}
	if claim.jobRev, err = kv.Create(ctx, claim.jobKey, hold, ttl); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		claim.release()
		return nil, "", fail(err)
	}
	return claim, "", nil
}

// release frees a claim whose job was not stored, if it still holds it.
func (u *uniqueClaim) release() {
	if u == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if u.jobRev != 0 {
		_ = u.kv.Purge(ctx, u.jobKey, jetstream.LastRevision(u.jobRev), jetstream.PurgeTTL(protocol.UniqueMarkerTTL))
	}
	// Left behind when the purge fails: the claim's TTL ends it.
	_ = u.kv.Purge(ctx, u.key, jetstream.LastRevision(u.keyRev), jetstream.PurgeTTL(protocol.UniqueMarkerTTL))
}

// releaseAfter releases the claim after its job's publish failed with
// err, when the job was surely not stored: JetStream refused it, or no
// stream answered. After a timeout the job may be stored: the claim stays
// (its TTL bounds it), and an Enqueue of the same job id again finds it
// its own.
func (u *uniqueClaim) releaseAfter(err error) {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		u.release()
	}
}

// duplicateResult is the result of a job whose unique key holder holds.
func duplicateResult(job *protocol.Job, holder string, span trace.Span) EnqueueResult {
	if span != nil {
		span.SetAttributes(attribute.Bool("duplicate", true), attribute.String("unique_holder", holder))
		span.End()
	}
	return EnqueueResult{JobID: holder, Queue: job.Queue, Kind: job.Kind, Duplicate: true}
}
