package topology_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// countUpdates counts stream, bucket and consumer update requests made on nc's server.
func countUpdates(t *testing.T, nc *nats.Conn) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	for _, subj := range []string{"$JS.API.STREAM.UPDATE.>", "$JS.API.CONSUMER.CREATE.*.*.>", "$JS.API.STREAM.DELETE.>", "$JS.API.STREAM.PURGE.>"} {
		sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
			if strings.HasPrefix(m.Subject, "$JS.API.CONSUMER") && !bytes.Contains(m.Data, []byte(`"action":"update"`)) {
				return
			}
			n.Add(1)
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	require.NoError(t, nc.Flush())
	return &n
}

func TestEnsureCreatesEverything(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	cfg := topology.Config{}
	require.NoError(t, topology.Ensure(ctx(t), js, cfg))
	_, err := topology.EnsureQueue(ctx(t), js, cfg, "default")
	require.NoError(t, err)

	jobs, err := js.Stream(ctx(t), protocol.StreamJobs)
	require.NoError(t, err)
	info := jobs.CachedInfo().Config
	assert.Equal(t, jetstream.WorkQueuePolicy, info.Retention)
	assert.Equal(t, []string{"jobs.>"}, info.Subjects)
	assert.Equal(t, topology.DefaultDuplicateWindow, info.Duplicates)
	assert.True(t, info.AllowDirect)
	for _, name := range []string{protocol.StreamDLQ, protocol.StreamEvents, protocol.StreamAdvisories} {
		_, err := js.Stream(ctx(t), name)
		assert.NoError(t, err, name)
	}
	for _, b := range []string{protocol.BucketSchedules, protocol.BucketScheduleState, protocol.BucketLeases, protocol.BucketAgents} {
		_, err := js.KeyValue(ctx(t), b)
		assert.NoError(t, err, b)
	}
	unique, err := js.KeyValue(ctx(t), protocol.BucketUnique)
	require.NoError(t, err)
	status, err := unique.Status(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, protocol.UniqueMarkerTTL, status.LimitMarkerTTL(), "per-key TTLs need limit markers")
	cons, err := js.Consumer(ctx(t), protocol.StreamJobs, "queue-default")
	require.NoError(t, err)
	cc := cons.CachedInfo().Config
	assert.Equal(t, "jobs.default.*", cc.FilterSubject)
	assert.Equal(t, jetstream.AckExplicitPolicy, cc.AckPolicy)
	assert.Equal(t, topology.DefaultAckWait, cc.AckWait)
	assert.Equal(t, topology.DefaultMaxDeliver, cc.MaxDeliver)
}

func TestEnsureConcurrentlyEndsWithOneTopologyAndRerunIsNoop(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	cfg := topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 45 * time.Second}}}

	// Eight "services", each with its own connection, provision at once.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	start := make(chan struct{})
	for i := range errs {
		_, js := natstest.JetStream(t, srv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := topology.Ensure(ctx(t), js, cfg); err != nil {
				errs[i] = err
				return
			}
			_, errs[i] = topology.EnsureQueue(ctx(t), js, cfg, "default")
		}()
	}
	close(start)
	wg.Wait()
	require.NoError(t, errors.Join(errs...))

	nc, js := natstest.JetStream(t, srv)
	names := map[string]bool{}
	lister := js.StreamNames(ctx(t))
	for n := range lister.Name() {
		names[n] = true
	}
	assert.Equal(t, map[string]bool{"JOBS": true, "DLQ": true, "EVENTS": true, "ADVISORIES": true,
		"KV_schedules": true, "KV_schedule_state": true, "KV_leases": true, "KV_agents": true, "KV_cancels": true, "KV_limits": true, "KV_unique": true, "KV_workflows": true, "WORKFLOWS": true, "KV_workflow_runs": true, "DELAYED": true}, names)
	cons, err := js.Consumer(ctx(t), protocol.StreamJobs, "queue-default")
	require.NoError(t, err)
	assert.Equal(t, 45*time.Second, cons.CachedInfo().Config.AckWait)

	updates := countUpdates(t, nc)
	require.NoError(t, topology.Ensure(ctx(t), js, cfg))
	_, err = topology.EnsureQueue(ctx(t), js, cfg, "default")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	assert.Zero(t, updates.Load(), "re-running provisioning changes nothing")

	cfg.DLQMaxAge = 2 * topology.DefaultDLQMaxAge
	require.NoError(t, topology.Ensure(ctx(t), js, cfg))
	require.NoError(t, nc.Flush())
	assert.Equal(t, int64(1), updates.Load(), "a changed setting is one update (and the counter sees updates)")
}

func TestConflictingStreamIsRefused(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	_, err := js.CreateStream(ctx(t), jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"orders.>"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx(t), "orders.1", []byte("keep me"))
	require.NoError(t, err)

	err = topology.Ensure(ctx(t), js, topology.Config{})
	var inc *topology.IncompatibleError
	require.ErrorAs(t, err, &inc)
	assert.Equal(t, "JOBS", inc.Name)
	assert.Contains(t, err.Error(), "retention is Limits, jetfleet needs WorkQueue")

	s, err := js.Stream(ctx(t), "JOBS")
	require.NoError(t, err)
	info, err := s.Info(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), info.State.Msgs, "the foreign stream keeps its data")
	assert.Equal(t, []string{"orders.>"}, info.Config.Subjects)
}

func TestForeignSubjectsAreRefused(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	_, err := js.CreateStream(ctx(t), jetstream.StreamConfig{Name: "DLQ", Subjects: []string{"mail.dead.>"}})
	require.NoError(t, err)
	err = topology.Ensure(ctx(t), js, topology.Config{})
	require.ErrorContains(t, err, "existing stream DLQ is incompatible: it captures subjects [mail.dead.>]")
}

func TestLoweringLimitsNeedsPermission(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	require.NoError(t, topology.Ensure(ctx(t), js, topology.Config{DLQMaxAge: 48 * time.Hour}))

	err := topology.Ensure(ctx(t), js, topology.Config{DLQMaxAge: time.Hour})
	require.ErrorContains(t, err, "lowering max_age")
	require.ErrorContains(t, err, "topology.allow_destructive_updates")

	require.NoError(t, topology.Ensure(ctx(t), js, topology.Config{DLQMaxAge: time.Hour, AllowDestructiveUpdates: true}))
	s, err := js.Stream(ctx(t), protocol.StreamDLQ)
	require.NoError(t, err)
	assert.Equal(t, time.Hour, s.CachedInfo().Config.MaxAge)

	require.NoError(t, topology.Ensure(ctx(t), js, topology.Config{DLQMaxAge: 72 * time.Hour}), "raising a limit is always safe")
	require.NoError(t, topology.Ensure(ctx(t), js, topology.Config{LeaseTTL: 2 * time.Second}), "leases are disposable")
}

func TestBucketHistoryIsNotTrimmedSilently(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	_, err := js.CreateKeyValue(ctx(t), jetstream.KeyValueConfig{Bucket: protocol.BucketSchedules, History: 10})
	require.NoError(t, err)
	err = topology.Ensure(ctx(t), js, topology.Config{})
	require.ErrorContains(t, err, "existing bucket schedules is incompatible: lowering its history from 10 to 5")
	require.NoError(t, topology.Ensure(ctx(t), js, topology.Config{AllowDestructiveUpdates: true}))
}

func TestEnsureQueueKeepsPause(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	cfg := topology.Config{}
	require.NoError(t, topology.Ensure(ctx(t), js, cfg))
	_, err := topology.EnsureQueue(ctx(t), js, cfg, "default")
	require.NoError(t, err)
	until := time.Now().Add(time.Hour)
	_, err = js.PauseConsumer(ctx(t), protocol.StreamJobs, "queue-default", until)
	require.NoError(t, err)

	cfg.Queues = map[string]topology.QueueConfig{"default": {AckWait: time.Minute}}
	cons, err := topology.EnsureQueue(ctx(t), js, cfg, "default")
	require.NoError(t, err)
	info, err := cons.Info(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, time.Minute, info.Config.AckWait, "settings are updated")
	assert.True(t, info.Paused, "a paused queue stays paused")
}

func TestEnsureQueueRefusesForeignConsumer(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	require.NoError(t, topology.Ensure(ctx(t), js, topology.Config{}))
	_, err := js.CreateConsumer(ctx(t), protocol.StreamJobs, jetstream.ConsumerConfig{
		Durable: "queue-default", FilterSubject: "jobs.default.only-this", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	_, err = topology.EnsureQueue(ctx(t), js, topology.Config{}, "default")
	require.ErrorContains(t, err, "existing consumer queue-default is incompatible")
}

func TestReplicatedTopologyOnCluster(t *testing.T) {
	t.Parallel()
	c := natstest.StartCluster(t, 3)
	nc := natstest.ConnectURL(t, c.URLs())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	cfg := topology.Config{Replicas: 3}
	require.NoError(t, topology.Ensure(ctx(t), js, cfg))
	_, err = topology.EnsureQueue(ctx(t), js, cfg, "default")
	require.NoError(t, err)
	s, err := js.Stream(ctx(t), protocol.StreamJobs)
	require.NoError(t, err)
	info, err := s.Info(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, 3, info.Config.Replicas)
	require.NotNil(t, info.Cluster)
	assert.Len(t, info.Cluster.Replicas, 2, "leader plus two replicas")
	kv, err := js.KeyValue(ctx(t), protocol.BucketSchedules)
	require.NoError(t, err)
	st, err := kv.Status(ctx(t))
	require.NoError(t, err)
	assert.Equal(t, 3, st.Config().Replicas)
	require.NoError(t, topology.Ensure(ctx(t), js, cfg), "re-run on the cluster")
}

func TestValidate(t *testing.T) {
	t.Parallel()
	err := topology.Config{Replicas: 7, Storage: "tape", LeaseTTL: time.Millisecond, EventBatches: "slow",
		Queues: map[string]topology.QueueConfig{"bad.name": {}, "ok": {AckWait: time.Millisecond}}}.Validate("topology")
	require.Error(t, err)
	for _, want := range []string{"topology.replicas", "topology.storage", "topology.lease_ttl", "topology.queues.bad.name", "topology.queues.ok.ack_wait",
		`topology.event_batches: must be fast or atomic, got "slow"`} {
		assert.Contains(t, err.Error(), want)
	}
	assert.NoError(t, topology.Config{}.Validate("topology"))
}

func TestVerifyWaitsForAnotherServiceToProvision(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	short, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	err := topology.Verify(short, js, topology.Config{})
	require.ErrorContains(t, err, "missing stream DELAYED")
	require.ErrorContains(t, err, "stream JOBS")
	require.ErrorContains(t, err, "topology.verify_only")

	verified := make(chan error, 1)
	go func() { verified <- topology.Verify(ctx(t), js, topology.Config{}) }()
	_, other := natstest.JetStream(t, srv)
	require.NoError(t, topology.Ensure(ctx(t), other, topology.Config{}))
	require.NoError(t, <-verified, "verify returns once the provisioning service is done")
}

func TestMaxJobSizeMustLeaveRoomForDeadLetters(t *testing.T) {
	t.Parallel()
	require.NoError(t, topology.Config{}.CheckServer(1<<20), "the defaults fit the server default")
	err := topology.Config{MaxJobSize: 1 << 20}.CheckServer(1 << 20)
	require.ErrorContains(t, err, "topology.max_job_size")
	require.ErrorContains(t, err, "must be at most 696KiB")
	require.NoError(t, topology.Config{MaxJobSize: 1 << 20}.CheckServer(8<<20))
}

func TestSubjectMatches(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		filter, subject string
		want            bool
	}{
		{"jobs.default.>", "jobs.default.echo", true},
		{"jobs.default.>", "jobs.default.a.b", true},
		{"jobs.default.>", "jobs.default", false},
		{"jobs.default.>", "jobs.other.echo", false},
		{"jobs.*.echo", "jobs.q.echo", true},
		{"jobs.*.echo", "jobs.q.other", false},
		{"jobs.*", "jobs.q.echo", false},
		{"jobs.>", "jobs.q", true},
		{"jobs.q.echo", "jobs.q.echo", true},
		{"jobs.q.echo", "jobs.q.echo.x", false},
	} {
		assert.Equal(t, tc.want, topology.SubjectMatches(tc.filter, tc.subject), "%s ~ %s", tc.filter, tc.subject)
	}
}

// TestEnsureQueueMakesAConsumerPerPriority: a queue has a consumer per
// priority, each with the queue's settings; a default consumer made before
// priorities (filter jobs.<queue>.>) is narrowed to jobs.<queue>.*, keeping
// its settings, so the priorities' consumers may exist beside it.
func TestEnsureQueueMakesAConsumerPerPriority(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	require.NoError(t, topology.Ensure(ctx(t), js, topology.Config{}))
	old := topology.QueueConsumerConfig("legacy", topology.QueueConfig{AckWait: 2 * time.Minute})
	old.FilterSubject = "jobs.legacy.>"
	_, err := js.CreateConsumer(ctx(t), protocol.StreamJobs, old)
	require.NoError(t, err)

	_, err = topology.EnsureQueue(ctx(t), js, topology.Config{}, "legacy")
	require.NoError(t, err)
	want := map[string]string{"queue-legacy": "jobs.legacy.*", "queue-legacy=high": "jobs.legacy.*.high", "queue-legacy=low": "jobs.legacy.*.low"}
	for name, filter := range want {
		cons, err := js.Consumer(ctx(t), protocol.StreamJobs, name)
		require.NoError(t, err, name)
		assert.Equal(t, filter, cons.CachedInfo().Config.FilterSubject, name)
		assert.Equal(t, 2*time.Minute, cons.CachedInfo().Config.AckWait, "%s keeps the queue's settings", name)
	}
}

// TestQueueWhoseConsumerHasNoLeaderIsNotUnroutable: on a three-node cluster
// the server leading a queue's consumer dies. Until another leads it, the
// cluster cannot read the consumer (it lists it as missing, which the
// client drops); the queue's jobs must not look unroutable meanwhile (the
// supervisor would dead-letter them), while a queue that has no consumer
// at all still does.
func TestQueueWhoseConsumerHasNoLeaderIsNotUnroutable(t *testing.T) {
	t.Parallel()
	cluster := natstest.StartCluster(t, 3)
	nc := natstest.ConnectURL(t, cluster.URLs())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	c := topology.Config{Replicas: 3}
	require.NoError(t, topology.Ensure(ctx(t), js, c))
	cons, err := topology.EnsureQueue(ctx(t), js, c, "default")
	require.NoError(t, err)
	for _, subject := range []string{"jobs.default.echo", "jobs.nosuchqueue.echo"} {
		_, err := js.Publish(ctx(t), subject, []byte(`{}`))
		require.NoError(t, err)
	}
	jobs, err := js.Stream(ctx(t), protocol.StreamJobs)
	require.NoError(t, err)
	unroutable, err := topology.UnroutableSubjects(ctx(t), jobs)
	require.NoError(t, err)
	require.Equal(t, map[string]uint64{"jobs.nosuchqueue.echo": 1}, unroutable)

	info, err := cons.Info(ctx(t))
	require.NoError(t, err)
	require.NotNil(t, info.Cluster)
	leader := info.Cluster.Leader
	for _, srv := range cluster.Servers {
		if srv.Name() == leader {
			srv.Shutdown()
		}
	}
	judged := 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		unroutable, err := topology.UnroutableSubjects(rctx, jobs)
		cancel()
		if err == nil {
			judged++
			assert.NotContains(t, unroutable, "jobs.default.echo", "a queue whose consumer has no leader looked unserved")
		}
		rctx, cancel = context.WithTimeout(context.Background(), time.Second)
		ci, err := cons.Info(rctx)
		cancel()
		if err == nil && ci.Cluster != nil && ci.Cluster.Leader != "" && ci.Cluster.Leader != leader && judged > 0 {
			break // led again, and judged since
		}
	}
	assert.Positive(t, judged)
}
