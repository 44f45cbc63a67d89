package scheduler

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
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/replica"
	"github.com/jetfleet/jetfleet/pkg/service"

	_ "time/tzdata" // the zone database, also on images without /usr/share/zoneinfo
)

// Scheduler is one replica of the scheduler service: it serves the
// schedule API, mirrors every definition and state, competes for the leader
// lease and, while it leads, fires. It is a lifecycle.Component.
type Scheduler struct {
	cfg      Config
	env      *service.Env
	clk      clock.Clock
	realClk  clock.Clock
	log      *slog.Logger
	nc       *nats.Conn
	js       jetstream.JetStream
	leaseTTL time.Duration
	// rep is this replica's share of the scheduler's leadership; the
	// engine sets it leading once it caught up (onLeadership).
	rep *replica.Replica

	defs, states, leases jetstream.KeyValue
	events               jetstream.Stream
	// stateStream is the stream behind bucket schedule_state, read
	// directly where the key's delete markers matter.
	stateStream jetstream.Stream

	metrics *metrics
	tracer  trace.Tracer
	eng     *engine
	svc     micro.Service
	runner  lifecycle.Runner

	defsSeen, statesSeen seqWaiter
	started              atomic.Bool

	// gone tracks runs whose job left JOBS without an event that ends them.
	gone goneRuns
	// lookupMu guards jobs and agents, looked up on first use.
	lookupMu sync.Mutex
	jobs     jetstream.Stream
	agents   jetstream.KeyValue
}

// New builds a scheduler replica from env (a connection to a provisioned
// JetStream). clk drives scheduling decisions; the leader lease always runs
// on the real clock because it races a TTL the server measures.
func New(cfg Config, env *service.Env, clk clock.Clock) (*Scheduler, error) {
	if env == nil || env.Conn == nil {
		return nil, errors.New("scheduler: env needs a NATS connection")
	}
	ttl := env.LeaseTTL()
	if err := cfg.Validate("scheduler", ttl); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults(ttl)
	if clk == nil {
		clk = clock.Real()
	}
	s := &Scheduler{cfg: cfg, env: env, clk: clk, realClk: clock.Real(), nc: env.Conn, leaseTTL: ttl,
		log: env.ComponentLogger("scheduler")}
	// An own JetStream context: a batch of fires keeps many async publishes
	// in flight.
	js, err := jetstream.New(env.Conn, jetstream.WithPublishAsyncMaxPending(1<<16), jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout))
	if err != nil {
		return nil, err
	}
	s.js = js
	var tp trace.TracerProvider = noop.NewTracerProvider()
	if env.Telemetry != nil {
		if env.Telemetry.TracerProvider != nil {
			tp = env.Telemetry.TracerProvider
		}
		s.metrics, err = newMetrics(env.Telemetry.MeterProvider)
	} else {
		s.metrics, err = newMetrics(nil)
	}
	if err != nil {
		return nil, fmt.Errorf("scheduler: metrics: %w", err)
	}
	s.tracer = tp.Tracer("github.com/jetfleet/jetfleet/pkg/scheduler")
	s.eng = newEngine(s)
	return s, nil
}

// Name implements lifecycle.Named.
func (s *Scheduler) Name() string { return "scheduler" }

// Start opens the buckets, starts the mirrors, the leader election and the
// API. It returns once the API is served; Ready reports when the mirrors
// have loaded.
func (s *Scheduler) Start(ctx context.Context) error {
	runCtx, err := s.runner.Begin(ctx)
	if err != nil {
		return err
	}
	for _, b := range []struct {
		kv   *jetstream.KeyValue
		name string
	}{{&s.defs, protocol.BucketSchedules}, {&s.states, protocol.BucketScheduleState}, {&s.leases, protocol.BucketLeases}} {
		kv, err := s.js.KeyValue(ctx, b.name)
		if err != nil {
			_ = s.runner.Stop(ctx)
			return fmt.Errorf("scheduler: bucket %s: %w", b.name, err)
		}
		*b.kv = kv
	}
	if s.events, err = s.js.Stream(ctx, protocol.StreamEvents); err != nil {
		_ = s.runner.Stop(ctx)
		return fmt.Errorf("scheduler: stream %s: %w", protocol.StreamEvents, err)
	}
	if s.stateStream, err = s.js.Stream(ctx, kvStream(protocol.BucketScheduleState)); err != nil {
		_ = s.runner.Stop(ctx)
		return fmt.Errorf("scheduler: stream of bucket %s: %w", protocol.BucketScheduleState, err)
	}
	s.rep = replica.New(replica.Config{Role: "scheduler", Name: s.env.Name, Leases: s.leases, TTL: s.leaseTTL, Conn: s.env.Conn,
		Lease: s.cfg.Settings, Log: s.log, SetsLeading: true,
		Tasks: []replica.Task{replica.LeadersElsewhere(s.js, FirePath, s.leaseTTL/2, s.log)},
		OnChange: func(leading bool) {
			s.eng.send(runCtx, func(e *engine) { e.onLeadership(leading) })
		}})
	s.runner.Go(s.eng.run)
	s.runner.Go(s.watchDefinitions)
	s.runner.Go(s.watchStates)
	s.rep.Start(&s.runner)
	svc, err := s.serveAPI()
	if err != nil {
		_ = s.Stop(ctx)
		return fmt.Errorf("scheduler: API: %w", err)
	}
	s.svc = svc
	// Once Start returns, requests reach the API. (Start's ctx may have no
	// deadline, which FlushWithContext requires.)
	flushCtx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	if err := s.nc.FlushWithContext(flushCtx); err != nil {
		_ = s.Stop(ctx)
		return fmt.Errorf("scheduler: flush: %w", err)
	}
	s.started.Store(true)
	s.log.Info("scheduler started", "holder", s.rep.Holder(), "lease_ttl", s.leaseTTL.String())
	return nil
}

// Stop stops serving, stops firing, then releases the lease so that another
// replica takes over at once. It is bounded by ctx and safe to call twice.
func (s *Scheduler) Stop(ctx context.Context) error {
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
	return err
}

// Done is closed once the scheduler's goroutines have returned after Stop.
func (s *Scheduler) Done() <-chan struct{} { return s.runner.Done() }

// Ready reports an error until the definition and state mirrors are loaded.
func (s *Scheduler) Ready(ctx context.Context) error {
	if !s.started.Load() {
		return errors.New("not started")
	}
	var ready bool
	if err := s.eng.call(ctx, func(e *engine) { ready = e.defsLoaded && e.statesLoaded }); err != nil {
		return err
	}
	if !ready {
		return errors.New("loading schedules")
	}
	return nil
}

// WaitLeading waits until the replica leads (or, with false, does not), or
// ctx ends.
func (s *Scheduler) WaitLeading(ctx context.Context, leading bool) error {
	return s.rep.WaitLeading(ctx, leading)
}

// IsLeader reports whether this replica holds the leader lease and is
// firing: the lease alone is not enough until the replica has caught up
// with the state its predecessor left.
func (s *Scheduler) IsLeader() bool { return s.rep != nil && s.rep.IsLeader() }

// HoldsLease reports whether this replica holds the leader lease.
func (s *Scheduler) HoldsLease() bool { return s.rep != nil && s.rep.HoldsLease() }

func (s *Scheduler) stateSubject(id string) string {
	return "$KV." + protocol.BucketScheduleState + "." + id
}

// kvStream is the name of the stream behind a key-value bucket.
func kvStream(bucket string) string { return "KV_" + bucket }

// FirePath is every stream the leader writes to when it fires, and so
// cannot fire without: the leader keeps them led from another NATS server
// than its own (replica.LeadersElsewhere).
var FirePath = []string{kvStream(protocol.BucketLeases), kvStream(protocol.BucketScheduleState), protocol.StreamJobs, protocol.StreamEvents}
