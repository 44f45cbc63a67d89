package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/replica"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Supervisor is one replica of the supervisor service. Every replica tracks
// the agents' heartbeats and serves the API; the replica holding the leader
// lease acts: it rescues the jobs of dead agents, cancels and fails overdue
// attempts, dead-letters jobs past max deliveries, escalates final failures,
// runs the circuit breakers and writes the execution history. It is a
// lifecycle.Component.
type Supervisor struct {
	cfg      Config
	env      *service.Env
	clk      clock.Clock
	log      *slog.Logger
	nc       *nats.Conn
	js       jetstream.JetStream
	topo     topology.Config
	leaseTTL time.Duration
	// rep is this replica's share of the supervisor's leadership: the
	// lease, and the leader's tasks (leaderTasks).
	rep *replica.Replica

	jobs, dlq, events, store, delayed jetstream.Stream
	agentsKV, leases                  jetstream.KeyValue
	// cancelsKV records the cancels of jobs (cancel.go).
	cancelsKV jetstream.KeyValue
	// unique holds bucket unique, looked up when the leader first releases
	// a claim (unique.go).
	unique uniqueBucket

	// client calls the scheduler's API (pausing a failing schedule).
	client  *jetfleet.Client
	metrics *metrics
	tracker *tracker
	alerter *alerter
	rates   *rates
	history *history
	trends  *trends
	// workflows runs workflow runs (workflows.go).
	workflows *workflows
	// queueDepthGauge is the queue-depth gauge's last measure (queuedepth.go).
	queueDepthGauge queueDepth
	svc             micro.Service
	runner          lifecycle.Runner

	// dlMu serializes dead-lettering by stream sequence, so an advisory and
	// the reconciliation never both act on one message.
	dlMu sync.Mutex

	started      atomic.Bool
	agentsLoaded atomic.Bool
}

// ConsumerName names the leader's durable consumer on each stream it reads
// (EVENTS, dead letters, advisories, WORKFLOWS).
const ConsumerName = "supervisor"

// New builds a supervisor replica from env (a connection to a provisioned
// JetStream). clk drives liveness, deadlines, breaker windows and alert
// dedupe; the leader lease always runs on the real clock because it races
// a TTL the server measures.
func New(cfg Config, env *service.Env, clk clock.Clock) (*Supervisor, error) {
	if env == nil || env.Conn == nil {
		return nil, errors.New("supervisor: env needs a NATS connection")
	}
	ttl := env.LeaseTTL()
	if err := cfg.Validate("supervisor", ttl); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults(ttl)
	if clk == nil {
		clk = clock.Real()
	}
	s := &Supervisor{cfg: cfg, env: env, clk: clk, nc: env.Conn, leaseTTL: ttl,
		log: env.ComponentLogger("supervisor")}
	if env.Base != nil {
		s.topo = env.Base.Topology
	}
	js, err := jetstream.New(env.Conn, jetstream.WithPublishAsyncMaxPending(4096), jetstream.WithPublishAsyncTimeout(cfg.RequestTimeout))
	if err != nil {
		return nil, err
	}
	s.js = js
	s.client = jetfleet.NewClient(env.Conn)
	if env.Telemetry != nil {
		s.metrics, err = newMetrics(env.Telemetry.MeterProvider)
	} else {
		s.metrics, err = newMetrics(nil)
	}
	if err != nil {
		return nil, fmt.Errorf("supervisor: metrics: %w", err)
	}
	s.tracker = newTracker(s)
	s.alerter = newAlerter(s)
	s.rates = newRates(s)
	s.history = newHistory(s)
	s.trends = newTrends(s)
	s.workflows = &workflows{s: s}
	return s, nil
}

// Name implements lifecycle.Named.
func (s *Supervisor) Name() string { return "supervisor" }

// Start opens the streams and buckets, provisions the supervisor's own
// stream and consumers, starts tracking agents, competes for the leader
// lease and serves the API.
func (s *Supervisor) Start(ctx context.Context) error {
	runCtx, err := s.runner.Begin(ctx)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		_ = s.Stop(context.WithoutCancel(ctx))
		return fmt.Errorf("supervisor: %w", err)
	}
	for _, st := range []struct {
		s    *jetstream.Stream
		name string
	}{{&s.jobs, protocol.StreamJobs}, {&s.dlq, protocol.StreamDLQ}, {&s.events, protocol.StreamEvents}, {&s.delayed, protocol.StreamDelayed}} {
		if *st.s, err = s.js.Stream(ctx, st.name); err != nil {
			return fail(fmt.Errorf("stream %s: %w", st.name, err))
		}
	}
	if s.agentsKV, err = s.js.KeyValue(ctx, protocol.BucketAgents); err != nil {
		return fail(fmt.Errorf("bucket %s: %w", protocol.BucketAgents, err))
	}
	if s.leases, err = s.js.KeyValue(ctx, protocol.BucketLeases); err != nil {
		return fail(fmt.Errorf("bucket %s: %w", protocol.BucketLeases, err))
	}
	if s.cancelsKV, err = s.js.KeyValue(ctx, protocol.BucketCancels); err != nil {
		return fail(fmt.Errorf("bucket %s: %w", protocol.BucketCancels, err))
	}
	if err := s.provision(ctx); err != nil {
		return fail(err)
	}
	if err := s.workflows.open(ctx); err != nil {
		return fail(err)
	}
	if err := topology.EnsureDeclaredQueues(ctx, s.js, s.topo); err != nil {
		return fail(err)
	}
	if err := s.tracker.start(runCtx); err != nil {
		return fail(fmt.Errorf("track agents: %w", err))
	}
	s.rep = replica.New(replica.Config{Role: "supervisor", Name: s.env.Name, Leases: s.leases, TTL: s.leaseTTL, Conn: s.env.Conn,
		Lease: s.cfg.Settings, Log: s.log, OnChange: s.onLeadership, Tasks: s.leaderTasks()})
	s.rep.Start(&s.runner)
	s.runner.Go(s.checkLoop)
	svc, err := s.serveAPI()
	if err != nil {
		return fail(fmt.Errorf("API: %w", err))
	}
	s.svc = svc
	fctx, cancel := s.requestCtx(ctx)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		return fail(fmt.Errorf("flush: %w", err))
	}
	s.started.Store(true)
	s.log.Info("supervisor started", "holder", s.rep.Holder(), "lease_ttl", s.leaseTTL.String(),
		"dead_after_missed_heartbeats", s.cfg.MissedHeartbeats)
	return nil
}

// provision creates the supervisor's stream and its durable consumers on
// ADVISORIES, DLQ and EVENTS. The consumers exist from the first start of
// any replica, so nothing published while no replica leads is missed.
func (s *Supervisor) provision(ctx context.Context) error {
	topo := s.topo.WithDefaults()
	storage := jetstream.FileStorage
	if topo.Storage == "memory" {
		storage = jetstream.MemoryStorage
	}
	want := jetstream.StreamConfig{
		Name:              protocol.StreamSupervisor,
		Description:       "jetfleet supervisor: execution history, replay markers, alert incidents",
		Subjects:          []string{protocol.SupervisorSubjects},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxAge:            s.cfg.HistoryMaxAge,
		MaxMsgsPerSubject: int64(s.cfg.HistorySize),
		Storage:           storage,
		Replicas:          topo.Replicas,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
	}
	if err := topology.EnsureStream(ctx, s.js, want, topo.AllowDestructiveUpdates); err != nil {
		return err
	}
	var err error
	if s.store, err = s.js.Stream(ctx, protocol.StreamSupervisor); err != nil {
		return err
	}
	consumers := []struct {
		stream string
		cfg    jetstream.ConsumerConfig
	}{
		{protocol.StreamAdvisories, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000}},
		{protocol.StreamDLQ, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy,
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000}},
		{protocol.StreamEvents, eventsConsumerConfig()},
		{protocol.StreamWorkflows, jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy,
			AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 1000}},
	}
	for _, c := range consumers {
		cfg := leaderConsumer(c.cfg)
		// An existing consumer with another configuration is kept; the
		// leader brings the EVENTS consumer up to date (adoptEvents).
		if _, err := s.js.CreateConsumer(ctx, c.stream, cfg); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return fmt.Errorf("consumer %s on %s: %w", ConsumerName, c.stream, err)
		}
	}
	return nil
}

// leaderConsumer completes the configuration of one of the leader's
// durable consumers.
func leaderConsumer(cfg jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	cfg.Durable, cfg.Name = ConsumerName, ConsumerName
	cfg.Description = "jetfleet supervisor leader"
	cfg.AckWait = 30 * time.Second
	cfg.MaxDeliver = -1
	return cfg
}

// Stop stops serving, stops acting, then releases the lease so another
// replica takes over at once. It is bounded by ctx and safe to call twice.
func (s *Supervisor) Stop(ctx context.Context) error {
	if s.svc != nil {
		_ = s.svc.Stop()
	}
	if s.rep != nil {
		s.rep.Resign()
	}
	err := s.runner.Stop(ctx)
	if s.rep != nil && s.nc.IsConnected() {
		s.rep.Release(ctx)
	}
	s.alerter.stop(ctx)
	return err
}

// Done is closed once the supervisor's goroutines have returned after Stop.
func (s *Supervisor) Done() <-chan struct{} { return s.runner.Done() }

// Ready reports an error until the replica has loaded the agent registry.
func (s *Supervisor) Ready(context.Context) error {
	if !s.started.Load() {
		return errors.New("not started")
	}
	if !s.agentsLoaded.Load() {
		return errors.New("loading agents")
	}
	return nil
}

// WaitLeading waits until the replica leads (or, with false, does not), or
// ctx ends.
func (s *Supervisor) WaitLeading(ctx context.Context, leading bool) error {
	return s.rep.WaitLeading(ctx, leading)
}

// IsLeader reports whether this replica holds the leader lease and acts.
func (s *Supervisor) IsLeader() bool { return s.rep != nil && s.rep.IsLeader() }

// Holder is the replica's name in the leader lease.
func (s *Supervisor) Holder() string { return s.rep.Holder() }

// onLeadership prepares a replica that gains leadership — the leader's
// caches start empty — and keeps the leading gauge. The leader's work is
// its tasks.
func (s *Supervisor) onLeadership(leading bool) {
	if !leading {
		s.metrics.leading.Store(0)
		return
	}
	s.history.reset()
	s.alerter.reset()
	s.rates.reset()
	s.trends.reset()
	s.workflows.forget()
	s.metrics.leading.Store(1)
}

// leaderTasks are what only the leader does, each while it leads:
// dead-letter jobs past max deliveries (from advisories, and by
// reconciliation), escalate dead letters, read job events (history,
// breaker samples, auto-pause), dead-letter jobs no queue serves, and adopt
// the breakers' state.
func (s *Supervisor) leaderTasks() []replica.Task {
	return []replica.Task{
		{Name: "max deliveries: advisories", Lead: s.consumeAdvisories},
		{Name: "max deliveries: reconciliation", Lead: s.reconcileLoop},
		{Name: "escalation: dead letters", Lead: s.consumeDeadLetters},
		{Name: "history: job events", Lead: s.consumeEvents},
		{Name: "queues: unroutable jobs", Lead: s.unroutableLoop},
		{Name: "breakers: adopt", Lead: s.rates.adopt},
		{Name: "trends: rollups and verdicts", Lead: s.trends.lead},
		{Name: "queues: depth gauge", Lead: s.queueDepthLoop},
		{Name: "workflows: forwarded requests", Lead: s.workflows.lead},
		{Name: "workflows: start messages", Lead: s.workflows.consumeStarts},
		{Name: "workflows: starts left under way", Lead: s.workflows.recoverStarts},
	}
}

// checkLoop runs check every check_interval until the supervisor stops.
func (s *Supervisor) checkLoop(ctx context.Context) {
	timer := s.clk.NewTimer(s.cfg.CheckInterval)
	defer timer.Stop()
	var lastDepth time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		}
		now := s.clk.Now()
		s.check(ctx, now)
		if now.Sub(lastDepth) >= s.cfg.Thresholds.DLQDepthInterval {
			lastDepth = now
			s.checkDLQDepth(ctx)
		}
		timer.Reset(s.cfg.CheckInterval)
	}
}

// check is one pass of the loops that run on every replica: liveness,
// deadlines and acks of the agents' jobs, and (leader) breaker cool-downs.
func (s *Supervisor) check(ctx context.Context, now time.Time) {
	leader := s.IsLeader()
	s.tracker.check(ctx, now, leader)
	if leader {
		s.rates.tick(ctx, now)
	}
}

// requestCtx bounds one request to the server.
func (s *Supervisor) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.RequestTimeout)
}
