package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Version is reported in heartbeats.
const Version = "jetfleet-go/0.1.0"

// Agent pulls jobs of its queues and runs them. Register handlers, then
// Start; Stop drains it gracefully.
type Agent struct {
	cfg      Config
	nc       *nats.Conn
	js       jetstream.JetStream
	topology topology.Config
	logger   *slog.Logger
	tracer   trace.TracerProvider
	meter    metric.MeterProvider

	kinds map[string]*kind
	// started is set by Start: kinds is read without a lock from then on,
	// so Register refuses.
	started atomic.Bool
	// execute is the whole execution of one job: tracing, logging and
	// metrics around bookkeeping, the handler chain and settlement.
	execute Handler

	queues  []*queueState
	pullers []*puller
	work    chan work // to idle workers
	// handlers holds one token per handler running, at most
	// cfg.Concurrency; nil without prefetch, where the slots bound them.
	handlers chan struct{}
	replies  *replies // answers to events and acks, awaited without blocking
	recorder *recorder
	events   jetstream.Stream // EVENTS, to read a job's events
	agentsKV jetstream.KeyValue
	fleet    *fleetView
	cancels  *cancelView
	limits   *fleetLimits // fleet-wide limits per kind (limits.go)

	runner    lifecycle.Runner
	jobs      sync.WaitGroup
	draining  atomic.Bool
	releasing atomic.Bool   // set once a stopping agent hands running jobs back
	hbKick    chan struct{} // asks for a heartbeat soon: a job was delivered
	startedAt time.Time
	hbSeq     atomic.Uint64
	control   *nats.Subscription
	// runningReg reports the jobs running now when metrics are collected.
	runningReg metric.Registration

	mu sync.Mutex
	// inflight holds every delivery being worked on, by its reply subject:
	// two deliveries of one message (its AckWait ran out meanwhile) are
	// two entries.
	inflight map[string]*execution

	slotMu    sync.Mutex
	nextQueue int // round-robin position among the busy queues for freed slots
	// probeFrom moves the start of the round that hands out probes.
	probeFrom atomic.Uint32
	// spare counts free slots no queue has work for: while every queue is
	// idle, each holds one slot in a request (its probe) and the rest wait
	// here for the first queue that gets a job.
	spare atomic.Int64

	// awaiting holds the finished jobs whose answer waits for their outcome
	// event to be stored (answerOnceStored); at most cfg.MaxUnconfirmed
	// before finishing jobs keep their slots.
	awaitMu  sync.Mutex
	awaiting map[*execution]struct{}
	// noSlot counts deliveries handed back for want of a free slot.
	noSlot metric.Int64Counter
}

type kind struct {
	name    string
	handler Handler // the handler chain: Timeout → middleware → Recover → handler
	timeout time.Duration
	retry   RetryPolicy
	sem     chan struct{} // nil when the kind has no concurrency cap
}

type queueState struct {
	name    string
	ackWait time.Duration // of the queue's consumers
	// pullers are the queue's, one per priority, highest first; share is
	// the smooth weighted round-robin state that splits freed slots
	// between the busy ones (guarded by Agent.slotMu).
	pullers []*puller
	share   map[*puller]int
}

// Option configures an Agent beyond its Config.
type Option func(*Agent)

// WithLogger logs through l (default: nothing is logged).
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.logger = l } }

// WithTracerProvider makes the agent's spans (agent.execute <kind>) with tp
// (default: no spans).
func WithTracerProvider(tp trace.TracerProvider) Option { return func(a *Agent) { a.tracer = tp } }

// WithMeterProvider records the agent's metrics with mp (default: none).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(a *Agent) { a.meter = mp } }

// WithTopology gives the agent the fleet's JetStream settings: the consumer
// settings of the queues declared under topology.queues, which an agent
// creates when they are missing. Default: every queue's defaults.
func WithTopology(t topology.Config) Option { return func(a *Agent) { a.topology = t } }

// WithEnv takes the logger, telemetry and topology of a service's
// environment (the agent service, the dev fleet, tests).
func WithEnv(env *service.Env) Option {
	return func(a *Agent) {
		if env.Logger != nil {
			a.logger = env.Logger
		}
		if env.Base != nil {
			a.topology = env.Base.Topology
		}
		if env.Telemetry != nil {
			a.tracer, a.meter = env.Telemetry.TracerProvider, env.Telemetry.MeterProvider
		}
	}
}

// New returns an agent that pulls and runs jobs on nc (which the caller
// keeps owning). Register handlers (AddHandler, Register), then Start.
func New(nc *nats.Conn, cfg Config, opts ...Option) (*Agent, error) {
	if nc == nil {
		return nil, errors.New("agent: a NATS connection is required")
	}
	if err := cfg.Validate("agent"); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	a := &Agent{
		cfg: cfg, nc: nc, js: js, logger: slog.New(slog.DiscardHandler),
		kinds: map[string]*kind{}, inflight: map[string]*execution{}, awaiting: map[*execution]struct{}{},
		tracer: nooptrace.NewTracerProvider(), meter: noopmetric.NewMeterProvider(),
	}
	for _, o := range opts {
		o(a)
	}
	a.logger = a.logger.With(telemetry.LogComponent, "agent", telemetry.LogAgentID, cfg.ID)
	a.execute = Chain(a.run, Tracing(a.tracer), Logging(a.logger), Metrics(a.meter), SchedulingDelay(a.meter))
	if a.noSlot, err = a.meter.Meter(TracerName).Int64Counter("jetfleet.agent.deliveries.without_slot",
		metric.WithDescription("Deliveries that arrived for no free slot (a pull request counted lost answered after all) and were handed back at once")); err != nil {
		return nil, fmt.Errorf("agent: metric: %w", err)
	}
	return a, nil
}

// ID is the agent's id.
func (a *Agent) ID() string { return a.cfg.ID }

// Name implements lifecycle.Named.
func (a *Agent) Name() string { return "agent " + a.cfg.ID }

// Done is closed once a stopped agent's goroutines have all returned.
func (a *Agent) Done() <-chan struct{} { return a.runner.Done() }

// Register runs handler for jobs of kind. Call it before Start, not while
// Start runs: after, it returns an error, as the running agent reads its
// kinds without a lock.
func (a *Agent) Register(kindName string, handler Handler, opts KindOptions) error {
	if a.started.Load() {
		return fmt.Errorf("agent: register kind %q before Start: agent %s already started", kindName, a.cfg.ID)
	}
	if err := protocol.ValidateToken("kind", kindName); err != nil {
		return err
	}
	if _, dup := a.kinds[kindName]; dup {
		return fmt.Errorf("kind %q registered twice", kindName)
	}
	if opts.Concurrency < 0 {
		return fmt.Errorf("kind %q: concurrency must not be negative", kindName)
	}
	k := &kind{name: kindName, timeout: opts.Timeout, retry: mergeRetry(opts.Retry, a.cfg.Retry.Policy())}
	if k.timeout == 0 {
		k.timeout = a.cfg.DefaultTimeout
	}
	if opts.Concurrency > 0 {
		k.sem = make(chan struct{}, opts.Concurrency)
	}
	chain := append([]Middleware{Timeout()}, a.cfg.Middleware...)
	chain = append(chain, Recover())
	k.handler = Chain(handler, chain...)
	a.kinds[kindName] = k
	return nil
}

// mergeRetry fills the zero fields of p from base, then the defaults.
func mergeRetry(p, base RetryPolicy) RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = base.MaxAttempts
	}
	if p.InitialDelay == 0 {
		p.InitialDelay = base.InitialDelay
	}
	if p.Multiplier == 0 {
		p.Multiplier = base.Multiplier
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = base.MaxDelay
	}
	if p.Jitter == 0 {
		p.Jitter = base.Jitter
	}
	p.NonRetryable = append(append([]error(nil), base.NonRetryable...), p.NonRetryable...)
	return p.WithDefaults()
}

// Kinds lists the registered kinds, sorted.
func (a *Agent) Kinds() []string {
	out := make([]string, 0, len(a.kinds))
	for k := range a.kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Start binds to the queues' consumers and begins pulling, heartbeating and
// answering control commands.
func (a *Agent) Start(ctx context.Context) error {
	if len(a.kinds) == 0 {
		return errors.New("agent: no job kinds registered")
	}
	a.started.Store(true)
	runCtx, err := a.runner.Begin(ctx)
	if err != nil {
		return err
	}
	a.startedAt = time.Now()
	a.hbKick = make(chan struct{}, 1)
	if a.events, err = a.js.Stream(ctx, protocol.StreamEvents); err != nil {
		return fmt.Errorf("agent: stream %s: %w", protocol.StreamEvents, err)
	}
	if a.agentsKV, err = a.js.KeyValue(ctx, protocol.BucketAgents); err != nil {
		return fmt.Errorf("agent: bucket %s: %w", protocol.BucketAgents, err)
	}
	for _, q := range a.cfg.Queues {
		cons, err := topology.EnsureQueue(ctx, a.js, a.topology, q)
		if err != nil {
			return fmt.Errorf("agent: queue %s: %w", q, err)
		}
		a.queues = append(a.queues, &queueState{name: q, ackWait: cons.CachedInfo().Config.AckWait})
	}
	a.fleet = newFleetView(a.js, a.agentsKV, a.cfg.ID, a.logger)
	if err := a.fleet.start(ctx, runCtx, &a.runner); err != nil {
		return fmt.Errorf("agent: watch agents: %w", err)
	}
	cancelsKV, err := a.js.KeyValue(ctx, protocol.BucketCancels)
	if err != nil {
		return fmt.Errorf("agent: bucket %s: %w", protocol.BucketCancels, err)
	}
	a.cancels = newCancelView(a.logger, a.cancelStarted)
	if err := mirrorBucket(ctx, runCtx, &a.runner, a.js, cancelsKV, a.cancels.apply); err != nil {
		return fmt.Errorf("agent: watch cancels: %w", err)
	}
	limitsKV, err := a.js.KeyValue(ctx, protocol.BucketLimits)
	if err != nil {
		return fmt.Errorf("agent: bucket %s: %w", protocol.BucketLimits, err)
	}
	a.limits = newFleetLimits(a.js, limitsKV, a.cfg.ID, a.logger)
	if err := mirrorBucket(ctx, runCtx, &a.runner, a.js, limitsKV, a.limits.apply); err != nil {
		return fmt.Errorf("agent: watch limits: %w", err)
	}
	a.runner.Go(a.limits.renewLoop)
	if a.replies, err = newReplies(a.nc, asyncTimeout); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.runner.Go(a.replies.expireLoop)
	gate := newConnGate(a.nc)
	a.recorder = newRecorder(a.js, a.replies, gate, a.logger)
	if err := a.batchEvents(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	gate.onDisconnect = append(gate.onDisconnect, a.replies.abandon)
	if a.recorder.batches != nil {
		gate.onDisconnect = append(gate.onDisconnect, a.recorder.batches.abandon)
	}
	a.runner.Go(gate.run)
	if a.control, err = a.nc.Subscribe(protocol.ControlSubject(a.cfg.ID), a.handleControl); err != nil {
		return fmt.Errorf("agent: control subject: %w", err)
	}
	if a.runningReg, err = a.runningMetric(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.runner.Go(a.heartbeatLoop)
	for _, q := range a.queues {
		for _, priority := range protocol.Priorities {
			p, err := newPuller(a, q, priority)
			if err != nil {
				return fmt.Errorf("agent: queue %s: %w", q.name, err)
			}
			// High and low start dormant: a queue that uses no priorities
			// keeps every slot for its default jobs (wakeDormant).
			p.dormant.Store(priority != protocol.PriorityDefault)
			a.pullers = append(a.pullers, p)
			q.pullers = append(q.pullers, p)
		}
	}
	a.runner.Go(a.progressLoop)
	a.runner.Go(a.checkLostLoop)
	a.work = make(chan work)
	for range a.cfg.slots() {
		a.runner.Go(a.worker)
	}
	if a.cfg.Prefetch > 0 {
		a.handlers = make(chan struct{}, a.cfg.Concurrency)
	}
	a.releaseSlots(a.cfg.slots()) // every slot is free: ask for jobs
	a.wakeDormant(ctx)            // a priority with jobs waiting already
	// Once Start returns, the server knows the agent's subscriptions: it
	// answers control commands.
	flushCtx, cancelFlush := context.WithTimeout(ctx, asyncTimeout) // FlushWithContext needs a deadline
	defer cancelFlush()
	if err := a.nc.FlushWithContext(flushCtx); err != nil {
		return fmt.Errorf("agent: flush: %w", err)
	}
	a.logger.Info("agent started", "queues", a.cfg.Queues, "kinds", a.Kinds(), "concurrency", a.cfg.Concurrency, "prefetch", a.cfg.Prefetch)
	return nil
}

// Stop stops pulling, lets running jobs finish while ctx allows, hands the
// rest back to JetStream for immediate redelivery elsewhere, flushes the
// bookkeeping and deregisters the agent. Jobs delivered by a pull request
// still open when Stop begins (at most agent.fetch_max_wait) run too.
func (a *Agent) Stop(ctx context.Context) error {
	if a.recorder == nil || !a.draining.CompareAndSwap(false, true) {
		return a.runner.Stop(ctx)
	}
	for _, p := range a.pullers {
		p.stop()
	}
	a.publishHeartbeat(true) // peers stop passing jobs to a draining agent

	// Keep a share of the grace for handing back and flushing.
	waitCtx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		reserve := min(time.Until(deadline)/5, 2*time.Second)
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithDeadline(ctx, deadline.Add(-reserve))
		defer cancel()
	}
	// Open requests end first (within fetch_max_wait): a job handed back
	// while they are open could come straight back, and only once nothing
	// more can be delivered may a.jobs be waited for.
	drained := waitFor(ctx, a.pullersDrained)
	if !drained {
		for _, p := range a.pullers {
			p.close() // the requests are never answered (a dead connection): give them up
		}
	}
	if !drained || !waitFor(waitCtx, a.jobs.Wait) {
		a.releasing.Store(true)
		a.releaseAll(ctx)
		if !waitFor(ctx, a.jobs.Wait) {
			a.logger.Warn("some handlers still run after the grace period")
		}
	}
	for _, p := range a.pullers {
		p.close()
	}

	_ = a.control.Unsubscribe()
	// Events are awaited (a failed one is sent again) while the expiry of
	// unanswered ones still runs, on the runner. Acks are only flushed to
	// the server: waiting for their confirmation would change nothing (an
	// ack whose confirmation is lost, e.g. with its consumer, leads to a
	// redelivery that is acked without running), and could take asyncTimeout.
	// Outcomes still waiting to be stored get until shortly before the end
	// of the grace; then their jobs are handed back, so none is left acked
	// without its outcome nor unanswered until AckWait.
	flushCtx := ctx
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		flushCtx, cancel = context.WithDeadline(ctx, deadline.Add(-min(time.Until(deadline)/5, time.Second)))
		defer cancel()
	}
	flushErr := a.recorder.flush(flushCtx)
	if n := a.handBackAwaiting(); n > 0 {
		a.logger.Warn("stopped before the outcome of some jobs was stored; they were handed back", "jobs", n)
	}
	if flushErr != nil && ctx.Err() == nil {
		flushErr = nil // what was not confirmed in time was handed back
	}
	flushErr = errors.Join(flushErr, a.nc.FlushWithContext(ctx))
	stopErr := a.runner.Stop(ctx) // heartbeats end here, before the registration goes
	if err := a.agentsKV.Delete(ctx, a.cfg.ID); err != nil {
		a.logger.Warn("agent registration not removed; its TTL drops it", telemetry.LogError, err)
	}
	a.recorder.close(ctx)
	if n := a.replies.close(); n > 0 {
		a.logger.Info("stopped before the server confirmed every ack; the acks were sent", "unconfirmed", n)
	}
	if err := a.runningReg.Unregister(); err != nil {
		a.logger.Warn("running-jobs metric not unregistered", telemetry.LogError, err)
	}
	a.logger.Info("agent stopped")
	return errors.Join(flushErr, stopErr)
}

func (a *Agent) pullersDrained() {
	for _, p := range a.pullers {
		<-p.drained
	}
}

// waitFor runs wait and reports whether it returned before ctx ended.
func waitFor(ctx context.Context, wait func()) bool {
	done := make(chan struct{})
	go func() {
		wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// releaseAll hands every job still running back to JetStream: their
// contexts end, and each job's goroutine NAKs it without spending an attempt.
// A handler that ignores its context gets the rest of the grace; then its
// job is NAKed from here (that delivery then counts as an attempt).
func (a *Agent) releaseAll(ctx context.Context) {
	a.mu.Lock()
	running := make([]*execution, 0, len(a.inflight))
	for _, ex := range a.inflight {
		running = append(running, ex)
	}
	a.mu.Unlock()
	if len(running) == 0 {
		return
	}
	for _, ex := range running {
		ex.cancel(errStopping)
	}
	// Handlers get what is left of the grace, less a little for flushing,
	// to end on their cancelled context and hand their jobs back themselves.
	settleCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if deadline, ok := ctx.Deadline(); ok {
		cancel()
		settleCtx, cancel = context.WithDeadline(ctx, deadline.Add(-min(time.Until(deadline)/4, 500*time.Millisecond)))
	}
	defer cancel()
	allDone := func() {
		for _, ex := range running {
			<-ex.done
		}
	}
	if waitFor(settleCtx, allDone) {
		a.logger.Warn("handed running jobs back for redelivery", "jobs", len(running))
		return
	}
	for _, ex := range running {
		if ex.claim() {
			a.logger.Warn("handler ignores cancellation; job handed back", telemetry.LogJobID, ex.job.ID)
			if err := ex.msg.Nak(); err != nil {
				a.logger.Warn("nak failed; JetStream redelivers after AckWait", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
			}
		}
	}
}

// startJob runs a delivered job on an idle worker, or a new goroutine
// when every worker is busy. The job holds the slot its puller reserved
// until its handler returns: settling (the confirmed ack) overlaps the
// request for the next job.
func (a *Agent) startJob(q *queueState, d *delivery, reserved bool) {
	a.jobs.Add(1)
	w := work{q: q, d: d, reserved: reserved}
	select {
	case a.work <- w:
	default:
		go a.runWork(w)
	}
}

// work is one delivery for a worker. reserved is false for a job no slot
// was reserved for (a late answer to a request counted lost): it runs, but
// gives no slot back when it ends, so the count of slots never grows.
type work struct {
	q        *queueState
	d        *delivery
	reserved bool
}

func (a *Agent) runWork(w work) {
	defer a.jobs.Done()
	a.process(w.q, w.d, w.reserved)
}

// worker runs jobs handed to it until the agent stops. Workers keep their
// grown stacks, which a goroutine per job would grow again every time.
func (a *Agent) worker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-a.work:
			a.runWork(w)
		}
	}
}

// releaseSlots offers n freed slots to the queues' pullers (one per queue
// and priority). A puller with no slot at all takes one first, its probe:
// every priority of every queue always has a request open, so a job on an
// idle one is seen — and, its slot kept free, starts at once. The rest go
// to the pullers that have work (busy: their latest request did not expire
// short of jobs): shared evenly between the queues, and within a queue by
// priority weight (high 16, default 4, low 1, smooth weighted round robin),
// so a higher priority takes most freed slots and a lower one still gets
// its share and never starves; each puller gets its share in one offer,
// so it asks for them in one request. With no busy puller they wait as
// spare slots, which the first puller to get a job claims (claimSpare).
// Slots no puller takes (the agent is stopping) stay unused.
func (a *Agent) releaseSlots(n int) {
	if n <= 0 || len(a.pullers) == 0 {
		return
	}
	// Probes go round, from a moving start, so that scarce slots (fewer
	// than pullers) reach every puller in turn.
	first := int(a.probeFrom.Add(1))
	for i := range a.pullers {
		if n > 0 && a.pullers[(first+i)%len(a.pullers)].takeProbe() {
			n--
		}
	}
	if n == 0 {
		return
	}
	shares := a.shareSlots(n)
	if shares == nil {
		a.spare.Add(int64(n))
		return
	}
	left := 0
	for p, k := range shares {
		if !p.offer(k) {
			left += k
		}
	}
	if left > 0 { // a puller is stopping: another may take its share
		for _, p := range a.pullers {
			if p.offer(left) {
				return
			}
		}
	}
}

// priorityWeight is a priority's share of freed slots while busy.
var priorityWeight = map[string]int{protocol.PriorityHigh: 16, protocol.PriorityDefault: 4, protocol.PriorityLow: 1}

// shareSlots splits n slots between the busy pullers; nil when none is busy.
func (a *Agent) shareSlots(n int) map[*puller]int {
	a.slotMu.Lock()
	defer a.slotMu.Unlock()
	var busy []*queueState
	for _, q := range a.queues {
		for _, p := range q.pullers {
			if p.busy.Load() {
				busy = append(busy, q)
				break
			}
		}
	}
	if len(busy) == 0 {
		return nil
	}
	shares := map[*puller]int{}
	for range n {
		q := busy[a.nextQueue%len(busy)]
		a.nextQueue++
		if p := q.pick(); p != nil {
			shares[p]++
		}
	}
	return shares
}

// pick chooses the busy puller of q the next slot goes to, by smooth
// weighted round robin: every busy puller gains its weight, the one with
// the most takes the slot and pays the total. Called with slotMu held.
func (q *queueState) pick() *puller {
	if q.share == nil {
		q.share = map[*puller]int{}
	}
	var best *puller
	total := 0
	for _, p := range q.pullers {
		if !p.busy.Load() {
			continue
		}
		w := priorityWeight[p.priority]
		q.share[p] += w
		total += w
		if best == nil || q.share[p] > q.share[best] {
			best = p
		}
	}
	if best != nil {
		q.share[best] -= total
	}
	return best
}

// claimSpare hands the spare slots to the busy queues: called when a
// queue gets a job.
func (a *Agent) claimSpare() {
	if a.spare.Load() == 0 {
		return
	}
	a.releaseSlots(int(a.spare.Swap(0)))
}

func (a *Agent) track(ex *execution) {
	a.mu.Lock()
	a.inflight[ex.msg.Reply()] = ex
	a.mu.Unlock()
}

func (a *Agent) untrack(ex *execution) {
	a.mu.Lock()
	if a.inflight[ex.msg.Reply()] == ex {
		delete(a.inflight, ex.msg.Reply())
	}
	a.mu.Unlock()
}

func (a *Agent) findJob(jobID string) *execution {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, ex := range a.inflight {
		if ex.job.ID == jobID {
			return ex
		}
	}
	return nil
}

// cancelStarted ends a job that was already running when its cancel,
// requested after the job was stored, reached bucket cancels: the
// supervisor saw it in no heartbeat yet, so it told no agent.
func (a *Agent) cancelStarted(c storedCancel) {
	ex := a.findJob(c.GetJobId())
	if ex == nil || ex.settled.Load() || !c.appliesTo(ex.job.ID, ex.msg.ack.Timestamp) {
		return
	}
	a.logger.Info("cancelling job on request", telemetry.LogJobID, c.GetJobId(), "reason", c.GetReason())
	ex.cancel(&cancelCommandError{reason: c.GetReason(), deadLetter: c.GetDeadLetter()})
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// batchEvents has the recorder publish events in atomic batches when the
// events stream takes them (topology sets allow_atomic), else in fast
// batches (allow_batched; a server older than 2.14 knows neither), one by
// one otherwise.
func (a *Agent) batchEvents() error {
	cfg := a.events.CachedInfo().Config
	if !cfg.AllowAtomicPublish && !cfg.AllowBatchPublish {
		a.logger.Info("the events stream takes no batches (allow_atomic, allow_batched); events are published one by one")
		return nil
	}
	batches, err := newEventBatches(a.nc, protocol.EventBatchCommitSubject(a.cfg.ID), cfg.AllowAtomicPublish, a.logger)
	if err != nil {
		return err
	}
	a.recorder.batches = batches
	a.runner.Go(batches.expireLoop)
	return nil
}
