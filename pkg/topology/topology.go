// Package topology provisions the JetStream streams, consumers and
// key-value buckets of a jetfleet fleet. Provisioning is idempotent and safe
// when several services start at once: what is missing is created, what
// differs in a safe way is updated, and what cannot change without losing
// data (or belongs to someone else) is refused with an error that says so.
package topology

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// IncompatibleError reports an existing stream, bucket or consumer that
// provisioning will not change.
type IncompatibleError struct {
	Kind   string // "stream", "bucket" or "consumer"
	Name   string
	Reason string
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("existing %s %s is incompatible: %s", e.Kind, e.Name, e.Reason)
}

// Streams returns the desired configuration of every stream.
func Streams(c Config) []jetstream.StreamConfig {
	c = c.WithDefaults()
	storage := storageType(c.Storage)
	return []jetstream.StreamConfig{
		{
			// Delayed jobs: a message schedule each, until it fires the job
			// onto its due subject, from which JOBS takes it. No limit may
			// drop a delayed job, nor a due one before JOBS took it: the due
			// ones leave after protocol.DelayedDueTTL (a per-message TTL).
			Name:              protocol.StreamDelayed,
			Description:       "jetfleet delayed jobs: delayed.<queue>.<kind>.<job>, fired onto due.<queue>.<kind>",
			Subjects:          []string{protocol.DelayedSubjects, protocol.DueSubjects},
			Retention:         jetstream.LimitsPolicy,
			Discard:           jetstream.DiscardOld,
			MaxMsgs:           -1,
			MaxBytes:          -1,
			MaxAge:            0,
			MaxMsgSize:        int32(c.MaxJobSize),
			Storage:           storage,
			Replicas:          c.Replicas,
			Duplicates:        c.DuplicateWindow,
			AllowDirect:       true,
			AllowMsgSchedules: true,
			AllowMsgTTL:       true,
			AllowRollup:       true,
		},
		{
			Name:        protocol.StreamJobs,
			Description: "jetfleet jobs: jobs.<queue>.<kind>",
			Subjects:    []string{protocol.JobsSubjects},
			Retention:   jetstream.WorkQueuePolicy,
			Discard:     jetstream.DiscardNew,
			MaxMsgs:     limit(c.MaxQueuedJobs),
			MaxBytes:    -1,
			MaxAge:      0,
			MaxMsgSize:  int32(c.MaxJobSize),
			Storage:     storage,
			Replicas:    c.Replicas,
			Duplicates:  c.DuplicateWindow,
			AllowDirect: true,
			// Delayed jobs come from DELAYED when due: due.<queue>.<kind>
			// becomes jobs.<queue>.<kind> (and due.<queue>.<kind>.<priority>
			// jobs.<queue>.<kind>.<priority>).
			Sources: []*jetstream.StreamSource{{
				Name: protocol.StreamDelayed,
				SubjectTransforms: []jetstream.SubjectTransformConfig{
					{Source: "due.*.*", Destination: "jobs.{{wildcard(1)}}.{{wildcard(2)}}"},
					{Source: "due.*.*.*", Destination: "jobs.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}"},
				},
			}},
		},
		{
			Name:        protocol.StreamDLQ,
			Description: "jetfleet dead letters: dlq.<queue>.<kind>",
			Subjects:    []string{protocol.DLQSubjects},
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxMsgs:     -1,
			MaxBytes:    limit(int64(c.DLQMaxBytes)),
			MaxAge:      c.DLQMaxAge,
			Storage:     storage,
			Replicas:    c.Replicas,
			Duplicates:  min(time.Hour, c.DLQMaxAge),
			AllowDirect: true,
		},
		{
			Name:        protocol.StreamEvents,
			Description: "jetfleet events: events.job.<queue>.<kind>.<type>.<job>, events.schedule.<id>.<type>",
			Subjects:    []string{protocol.EventsSubjects},
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxMsgs:     -1,
			MaxBytes:    limit(int64(c.EventsMaxBytes)),
			MaxAge:      c.EventsMaxAge,
			Storage:     storage,
			Replicas:    c.Replicas,
			Duplicates:  min(2*time.Minute, c.EventsMaxAge),
			AllowDirect: true,
			// Agents publish their events in fast batches (server
			// 2.14+), or atomic ones (2.12+: one sync per batch when
			// every write is synced) where event_batches says so.
			AllowAtomicPublish: c.EventBatches == EventBatchesAtomic,
			AllowBatchPublish:  true,
		},
		{
			Name:        protocol.StreamWorkflows,
			Description: "jetfleet workflow starts: workflows.<workflow>",
			Subjects:    []string{protocol.WorkflowsSubjects},
			Retention:   jetstream.WorkQueuePolicy,
			Discard:     jetstream.DiscardNew,
			MaxMsgs:     -1,
			MaxBytes:    -1,
			MaxMsgSize:  int32(c.MaxJobSize),
			Storage:     storage,
			Replicas:    c.Replicas,
			Duplicates:  c.DuplicateWindow,
		},
		{
			Name:        protocol.StreamAdvisories,
			Description: "JetStream advisories about the JOBS stream, kept for the supervisor",
			Subjects:    []string{protocol.AdvisoryMaxDeliveriesSubjects, protocol.AdvisoryTerminatedSubjects},
			Retention:   jetstream.LimitsPolicy,
			Discard:     jetstream.DiscardOld,
			MaxMsgs:     -1,
			MaxBytes:    -1,
			MaxAge:      c.EventsMaxAge,
			Storage:     storage,
			Replicas:    c.Replicas,
			Duplicates:  min(2*time.Minute, c.EventsMaxAge),
		},
	}
}

// bucketSpec is a bucket's desired configuration and whether its content
// is disposable (a limit may then shrink without AllowDestructiveUpdates).
type bucketSpec struct {
	cfg        jetstream.KeyValueConfig
	disposable bool
}

func buckets(c Config) []bucketSpec {
	c = c.WithDefaults()
	storage := storageType(c.Storage)
	kv := func(name, desc string, history uint8, ttl time.Duration) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{Bucket: name, Description: desc, History: history, TTL: ttl,
			Storage: storage, Replicas: c.Replicas, MaxBytes: -1, MaxValueSize: -1}
	}
	return []bucketSpec{
		{cfg: kv(protocol.BucketSchedules, "jetfleet schedule definitions", 5, 0)},
		{cfg: kv(protocol.BucketScheduleState, "jetfleet schedule state", 1, 0)},
		{cfg: kv(protocol.BucketLeases, "jetfleet leader leases", 1, c.LeaseTTL), disposable: true},
		{cfg: kv(protocol.BucketAgents, "jetfleet agent registry", 1, c.AgentTTL), disposable: true},
		{cfg: kv(protocol.BucketCancels, "jetfleet cancels of jobs not running", 1, c.CancelTTL)},
		{cfg: limitsBucket(kv(protocol.BucketLimits, "jetfleet fleet-wide limits per kind", 1, 0))},
		{cfg: uniqueBucket(kv(protocol.BucketUnique, "jetfleet unique job keys", 1, 0))},
		{cfg: kv(protocol.BucketWorkflows, "jetfleet workflow definitions", 5, 0)},
		{cfg: kv(protocol.BucketWorkflowRuns, "jetfleet workflow runs", 1, c.WorkflowRunTTL)},
	}
}

// StreamNames are the names of every stream Ensure provisions, the
// key-value buckets' streams (KV_<bucket>) included.
func StreamNames() []string {
	var names []string
	for _, sc := range Streams(Config{}) {
		names = append(names, sc.Name)
	}
	for _, b := range buckets(Config{}) {
		names = append(names, "KV_"+b.cfg.Bucket)
	}
	return names
}

// limitsBucket lets the limits bucket's keys carry their own TTL (a
// concurrency slot expires unless its holder renews it).
func limitsBucket(cfg jetstream.KeyValueConfig) jetstream.KeyValueConfig {
	cfg.LimitMarkerTTL = protocol.LimitSlotTTL
	return cfg
}

// uniqueBucket is bucket unique: no bucket TTL (each claim has its own),
// markers that expire (per-key TTLs need them, server 2.11+).
func uniqueBucket(cfg jetstream.KeyValueConfig) jetstream.KeyValueConfig {
	cfg.LimitMarkerTTL = protocol.UniqueMarkerTTL
	return cfg
}

// Ensure provisions every stream and bucket of c.
func Ensure(ctx context.Context, js jetstream.JetStream, c Config) error {
	for _, sc := range Streams(c) {
		if err := EnsureStream(ctx, js, sc, c.AllowDestructiveUpdates); err != nil {
			return err
		}
	}
	for _, b := range buckets(c) {
		if err := ensureBucket(ctx, js, b, c.AllowDestructiveUpdates); err != nil {
			return err
		}
	}
	return ensureDelayedConsumer(ctx, js)
}

// DelayedConsumerConfig is the consumer of DELAYED nobody reads: its
// pending count is the count of delayed jobs (cheap to ask, where counting
// a million subjects is not).
func DelayedConsumerConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Name: protocol.DelayedConsumer, Durable: protocol.DelayedConsumer,
		Description:   "jetfleet: counts delayed jobs (never read)",
		FilterSubject: protocol.DelayedSubjects,
		DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckExplicitPolicy,
	}
}

func ensureDelayedConsumer(ctx context.Context, js jetstream.JetStream) error {
	if _, err := js.CreateConsumer(ctx, protocol.StreamDelayed, DelayedConsumerConfig()); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
		return fmt.Errorf("create consumer %s of %s: %w", protocol.DelayedConsumer, protocol.StreamDelayed, err)
	}
	return nil
}

// verifyRoundTimeout bounds one round of Verify's checks.
const verifyRoundTimeout = 5 * time.Second

// Verify waits until every stream and bucket of c exists, for services that
// may not create them; it fails with what is still missing when ctx ends.
func Verify(ctx context.Context, js jetstream.JetStream, c Config) error {
	for {
		var missing []string
		// Each round is bounded on its own: a request the server leaves
		// unanswered (a cluster node whose JetStream has not found its meta
		// leader yet) must not hold the wait to its end, when the next
		// round would find everything there.
		roundCtx, cancel := context.WithTimeout(ctx, verifyRoundTimeout)
		for _, sc := range Streams(c) {
			if _, err := js.Stream(roundCtx, sc.Name); err != nil {
				missing = append(missing, "stream "+sc.Name+" ("+err.Error()+")")
			}
		}
		for _, b := range buckets(c) {
			if _, err := js.KeyValue(roundCtx, b.cfg.Bucket); err != nil {
				missing = append(missing, "bucket "+b.cfg.Bucket+" ("+err.Error()+")")
			}
		}
		cancel()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topology not provisioned (topology.verify_only is set, so this service waits for another to create it): missing %s",
				strings.Join(missing, ", "))
		case <-time.After(500 * time.Millisecond): // polling for another service's work; no event announces it
		}
	}
}

// EnsureStream creates the stream or brings an existing one to want.
func EnsureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, allowDestructive bool) error {
	for attempt := 0; ; attempt++ {
		err := whilePeersReport(ctx, func() error { _, err := js.CreateStream(ctx, want); return err })
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("create stream %s: %w", want.Name, err)
		}
		s, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) && attempt < 3 {
			continue // deleted between our create and our lookup
		}
		if err != nil {
			return fmt.Errorf("look up stream %s: %w", want.Name, err)
		}
		have := s.CachedInfo().Config
		update, err := reconcileStream(have, want, allowDestructive)
		if err != nil || update == nil {
			return err
		}
		if _, err := js.UpdateStream(ctx, *update); err != nil {
			return fmt.Errorf("update stream %s: %w", want.Name, err)
		}
		return nil
	}
}

// ErrCodeNoPeers is JetStream's "no suitable peers for placement": a node
// is offline, or a cluster just formed has not heard every node's state yet.
const ErrCodeNoPeers jetstream.ErrorCode = 10005

// placementRetry is the wait before a create refused for placement is
// tried again.
const placementRetry = 250 * time.Millisecond

// whilePeersReport runs create until the cluster can place what it
// creates or ctx ends: a service starting with a cluster that has just
// formed, or while a node restarts, waits for the node instead of failing.
func whilePeersReport(ctx context.Context, create func() error) error {
	for {
		err := create()
		var apiErr *jetstream.APIError
		if err == nil || !errors.As(err, &apiErr) || apiErr.ErrorCode != ErrCodeNoPeers {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(placementRetry): // the cluster announces no node's return: try again
		}
	}
}

// reconcileStream returns the config to update have with, nil when it
// already matches, or an error when the change is refused.
func reconcileStream(have, want jetstream.StreamConfig, allowDestructive bool) (*jetstream.StreamConfig, error) {
	bad := func(format string, args ...any) error {
		return &IncompatibleError{Kind: "stream", Name: want.Name, Reason: fmt.Sprintf(format, args...)}
	}
	if have.Retention != want.Retention {
		return nil, bad("retention is %s, jetfleet needs %s; changing it is not possible in place", have.Retention, want.Retention)
	}
	if have.Storage != want.Storage {
		return nil, bad("storage is %s, configured %s; changing it is not possible in place", have.Storage, want.Storage)
	}
	if !slices.Equal(sorted(have.Subjects), sorted(want.Subjects)) {
		return nil, bad("it captures subjects %v, jetfleet needs %v; it may belong to another application", have.Subjects, want.Subjects)
	}
	if !allowDestructive {
		for _, l := range []struct {
			name       string
			have, want int64
		}{
			{"max_age", int64(have.MaxAge), int64(want.MaxAge)},
			{"max_bytes", have.MaxBytes, want.MaxBytes},
			{"max_msgs", have.MaxMsgs, want.MaxMsgs},
			{"max_msgs_per_subject", have.MaxMsgsPerSubject, want.MaxMsgsPerSubject},
		} {
			if lowers(l.have, l.want) {
				return nil, bad("lowering %s from %d to %d could delete stored messages; set topology.allow_destructive_updates to allow it",
					l.name, l.have, l.want)
			}
		}
	}
	next := have // keep what jetfleet does not manage
	next.Description = want.Description
	next.Discard = want.Discard
	next.MaxMsgs = want.MaxMsgs
	next.MaxBytes = want.MaxBytes
	next.MaxAge = want.MaxAge
	next.MaxMsgsPerSubject = want.MaxMsgsPerSubject
	next.MaxMsgSize = want.MaxMsgSize
	next.Replicas = want.Replicas
	next.Duplicates = want.Duplicates
	next.AllowDirect = want.AllowDirect
	next.AllowBatchPublish = want.AllowBatchPublish
	next.AllowAtomicPublish = want.AllowAtomicPublish
	next.AllowMsgSchedules = want.AllowMsgSchedules || have.AllowMsgSchedules // cannot be turned off
	next.AllowMsgTTL = want.AllowMsgTTL || have.AllowMsgTTL                   // cannot be turned off
	if want.AllowRollup {
		next.AllowRollup, next.DenyPurge = true, false
	}
	if want.Sources != nil {
		next.Sources = want.Sources
	}
	if streamManagedEqual(have, next) {
		return nil, nil
	}
	return &next, nil
}

func streamManagedEqual(a, b jetstream.StreamConfig) bool {
	return a.Description == b.Description && a.Discard == b.Discard &&
		sameLimit(a.MaxMsgs, b.MaxMsgs) && sameLimit(a.MaxBytes, b.MaxBytes) && a.MaxAge == b.MaxAge &&
		sameLimit(a.MaxMsgsPerSubject, b.MaxMsgsPerSubject) && sameLimit(int64(a.MaxMsgSize), int64(b.MaxMsgSize)) &&
		a.Replicas == b.Replicas && a.Duplicates == b.Duplicates && a.AllowDirect == b.AllowDirect &&
		a.AllowBatchPublish == b.AllowBatchPublish && a.AllowMsgSchedules == b.AllowMsgSchedules &&
		a.AllowMsgTTL == b.AllowMsgTTL && a.AllowRollup == b.AllowRollup && a.DenyPurge == b.DenyPurge &&
		sameSources(a.Sources, b.Sources)
}

// sameSources compares the sources jetfleet sets: names and transforms.
func sameSources(a, b []*jetstream.StreamSource) bool {
	return slices.EqualFunc(a, b, func(x, y *jetstream.StreamSource) bool {
		return x.Name == y.Name && x.FilterSubject == y.FilterSubject &&
			slices.EqualFunc(x.SubjectTransforms, y.SubjectTransforms, func(p, q jetstream.SubjectTransformConfig) bool {
				return p.Source == q.Source && p.Destination == q.Destination
			})
	})
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, spec bucketSpec, allowDestructive bool) error {
	want := spec.cfg
	err := whilePeersReport(ctx, func() error { _, err := js.CreateKeyValue(ctx, want); return err })
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrBucketExists) {
		return fmt.Errorf("create bucket %s: %w", want.Bucket, err)
	}
	kv, err := js.KeyValue(ctx, want.Bucket)
	if err != nil {
		return fmt.Errorf("look up bucket %s: %w", want.Bucket, err)
	}
	status, err := kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("status of bucket %s: %w", want.Bucket, err)
	}
	have := status.Config()
	bad := func(format string, args ...any) error {
		return &IncompatibleError{Kind: "bucket", Name: want.Bucket, Reason: fmt.Sprintf(format, args...)}
	}
	if have.Storage != want.Storage {
		return bad("storage is %s, configured %s; changing it is not possible in place", have.Storage, want.Storage)
	}
	if !allowDestructive && !spec.disposable {
		if lowers(int64(have.TTL), int64(want.TTL)) {
			return bad("lowering its TTL from %s to %s could delete stored values; set topology.allow_destructive_updates to allow it", have.TTL, want.TTL)
		}
		if have.History > want.History {
			return bad("lowering its history from %d to %d deletes stored revisions; set topology.allow_destructive_updates to allow it", have.History, want.History)
		}
	}
	if have.TTL == want.TTL && have.History == want.History && have.Replicas == want.Replicas &&
		have.Description == want.Description {
		return nil
	}
	if _, err := js.UpdateKeyValue(ctx, want); err != nil {
		return fmt.Errorf("update bucket %s: %w", want.Bucket, err)
	}
	return nil
}

// QueueConsumerConfig is the desired default-priority consumer of queue.
func QueueConsumerConfig(queue string, q QueueConfig) jetstream.ConsumerConfig {
	return PriorityConsumerConfig(queue, protocol.PriorityDefault, q)
}

// PriorityConsumerConfig is the desired consumer of queue's jobs at
// priority p: every priority of a queue has the queue's settings.
func PriorityConsumerConfig(queue, p string, q QueueConfig) jetstream.ConsumerConfig {
	q = q.WithDefaults()
	name := protocol.PriorityConsumer(queue, p)
	description := "jetfleet queue " + queue
	if p != protocol.PriorityDefault {
		description += ", priority " + p
	}
	return jetstream.ConsumerConfig{
		Name:          name,
		Durable:       name,
		Description:   description,
		FilterSubject: protocol.PrioritySubjects(queue, p),
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       q.AckWait,
		MaxDeliver:    q.MaxDeliver,
		MaxAckPending: q.MaxAckPending,
		ReplayPolicy:  jetstream.ReplayInstantPolicy,
	}
}

// EnsureQueue creates the durable consumers of queue — one per priority —
// that are missing, and returns the default one. A queue declared under
// topology.queues is also brought to its declared settings; any other
// queue keeps the settings it was created with (by `jetfleet queue add`,
// or the defaults). A pause (set by the supervisor's circuit breaker)
// stays in place. A default consumer from before priorities (filter
// jobs.<queue>.>) is narrowed to jobs.<queue>.*.
func EnsureQueue(ctx context.Context, js jetstream.JetStream, c Config, queue string) (jetstream.Consumer, error) {
	if err := protocol.ValidateToken("queue", queue); err != nil {
		return nil, err
	}
	def, err := ensureQueueConsumer(ctx, js, PriorityConsumerConfig(queue, protocol.PriorityDefault, c.Queue(queue)), c.Declared(queue))
	if err != nil {
		return nil, err
	}
	// The other priorities take the default consumer's settings: those of
	// a queue not declared are whatever `jetfleet queue add` gave it.
	have := def.CachedInfo().Config
	settings := QueueConfig{AckWait: have.AckWait, MaxDeliver: have.MaxDeliver, MaxAckPending: have.MaxAckPending}
	for _, p := range protocol.Priorities {
		if p == protocol.PriorityDefault {
			continue
		}
		if _, err := ensureQueueConsumer(ctx, js, PriorityConsumerConfig(queue, p, settings), c.Declared(queue)); err != nil {
			return nil, err
		}
	}
	return def, nil
}

func ensureQueueConsumer(ctx context.Context, js jetstream.JetStream, want jetstream.ConsumerConfig, declared bool) (jetstream.Consumer, error) {
	cons, err := js.CreateConsumer(ctx, protocol.StreamJobs, want)
	if err == nil {
		return cons, nil
	}
	if !errors.Is(err, jetstream.ErrConsumerExists) {
		return nil, fmt.Errorf("create consumer %s: %w", want.Name, err)
	}
	cons, err = js.Consumer(ctx, protocol.StreamJobs, want.Name)
	if err != nil {
		return nil, fmt.Errorf("look up consumer %s: %w", want.Name, err)
	}
	have := cons.CachedInfo().Config
	narrow := have.FilterSubject == strings.TrimSuffix(want.FilterSubject, "*")+">" && strings.HasSuffix(want.FilterSubject, ".*")
	if (have.FilterSubject != want.FilterSubject && !narrow) || have.AckPolicy != want.AckPolicy {
		return nil, &IncompatibleError{Kind: "consumer", Name: want.Name,
			Reason: fmt.Sprintf("filter %q with ack policy %s; jetfleet needs %q with %s", have.FilterSubject, have.AckPolicy, want.FilterSubject, want.AckPolicy)}
	}
	if !declared && !narrow {
		return cons, nil
	}
	if !narrow && have.AckWait == want.AckWait && have.MaxDeliver == want.MaxDeliver && have.MaxAckPending == want.MaxAckPending &&
		have.Description == want.Description {
		return cons, nil
	}
	if !declared { // only narrowed: the queue keeps its settings
		have.FilterSubject = want.FilterSubject
		want = have
	}
	want.PauseUntil = have.PauseUntil
	cons, err = js.UpdateConsumer(ctx, protocol.StreamJobs, want)
	if err != nil {
		return nil, fmt.Errorf("update consumer %s: %w", want.Name, err)
	}
	return cons, nil
}

func storageType(s string) jetstream.StorageType {
	if s == "memory" {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
}

// limit maps "0 = unlimited" configuration values to JetStream's -1.
func limit(v int64) int64 {
	if v <= 0 {
		return -1
	}
	return v
}

// sameLimit compares limits where zero and negative both mean unlimited.
func sameLimit(a, b int64) bool { return limit(a) == limit(b) }

// lowers reports whether going from have to want tightens a limit (0 or
// negative is unlimited).
func lowers(have, want int64) bool {
	if want <= 0 {
		return false
	}
	return have <= 0 || want < have
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
