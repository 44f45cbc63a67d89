package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Figures of the schedules scenario.
var (
	figSchedLoad    = figureSpec{name: "load_time", label: "S definitions written and loaded", unit: UnitS}
	figFireDelayP50 = figureSpec{name: "fire_delay_p50", label: "fire delay p50 (stored − nominal)", unit: UnitMs}
	figFireDelayP99 = figureSpec{name: "fire_delay_p99", label: "fire delay p99", unit: UnitMs, target: &Target{Value: 250}}
	figFireDelayMax = figureSpec{name: "fire_delay_max", label: "fire delay max", unit: UnitMs}
	figHeapPerIdle  = figureSpec{name: "heap_per_idle_schedule", label: "heap per idle schedule", unit: UnitBytes, target: &Target{Value: 1024}}
)

// kindTick is the kind of the jobs the bench's schedules fire.
const kindTick = "tick"

// schedules measures one run: the delay of S one-shot schedules due in the
// same second, then (on a server of its own) the heap a scheduler replica
// holds per loaded idle schedule.
func (b *bencher) schedules(ctx context.Context, run int) error {
	delays, load, err := b.simultaneousFires(ctx)
	if err != nil {
		return err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.record(ScenarioSchedules, figSchedLoad, load.Seconds())
	b.record(ScenarioSchedules, figFireDelayP50, ms(Percentile(delays, 0.50)))
	b.record(ScenarioSchedules, figFireDelayP99, ms(Percentile(delays, 0.99)))
	b.record(ScenarioSchedules, figFireDelayMax, ms(delays[len(delays)-1]))
	perSchedule, err := b.idleHeap(ctx)
	if err != nil {
		return err
	}
	b.record(ScenarioSchedules, figHeapPerIdle, perSchedule)
	b.progress("schedules run %d: %d fires p99 %.0f ms; %.0f heap bytes per idle schedule", run, len(delays),
		ms(Percentile(delays, 0.99)), perSchedule)
	return nil
}

// simultaneousFires loads S one-shot schedules due in the same second into
// a leading scheduler and returns their fire delays, sorted, and how long
// writing and loading them took.
func (b *bencher) simultaneousFires(ctx context.Context) ([]time.Duration, time.Duration, error) {
	rs, err := b.open(ctx, serverOptions{ownFleet: true})
	if err != nil {
		return nil, 0, err
	}
	defer rs.close(ctx)
	n := b.cfg.Schedules
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ScheduleLead+phaseTimeout(n))
	defer cancel()
	s, err := startScheduler(ctx, rs, "scheduler")
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = s.Stop(context.WithoutCancel(ctx)) }()
	if err := waitLeader(ctx, s); err != nil {
		return nil, 0, err
	}
	writer, err := rs.connect("writer")
	if err != nil {
		return nil, 0, err
	}
	queue := rs.queue("fires")

	now := time.Now()
	at := now.Truncate(time.Second).Add(b.cfg.ScheduleLead)
	start := time.Now()
	if err := PutSchedules(ctx, writer.Conn, OneShots(queue+"-", n, at, now, queue, kindTick)); err != nil {
		return nil, 0, err
	}
	if err := waitGauge(ctx, rs.tel.Registry, "jetfleet_scheduler_schedules", float64(n)); err != nil {
		return nil, 0, err
	}
	load := time.Since(start)
	if time.Now().After(at) {
		return nil, 0, fmt.Errorf("the %d schedules were loaded %s after they were due; raise -schedule-lead (%s)",
			n, time.Since(at).Round(time.Millisecond), b.cfg.ScheduleLead)
	}
	got, err := StoredFires(ctx, writer.JetStream, rs.topo, queue, n)
	if err != nil {
		return nil, 0, err
	}
	delays := make([]time.Duration, len(got))
	for i, f := range got {
		delays[i] = f.Delay()
	}
	slices.Sort(delays)
	return delays, load, nil
}

// idleHeap loads IdleSchedules definitions with their states into a
// scheduler replica and returns the heap it holds per schedule: the growth
// of the process's live heap across the replica's start and load. The
// buckets are in memory storage, which an embedded server fills before the
// first measure, so the server's share stays constant.
func (b *bencher) idleHeap(ctx context.Context) (float64, error) {
	rs, err := b.open(ctx, serverOptions{ownFleet: true, topology: topology.Config{Storage: "memory"}})
	if err != nil {
		return 0, err
	}
	defer rs.close(ctx)
	n := b.cfg.IdleSchedules
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout(n))
	defer cancel()
	writer, err := rs.connect("writer")
	if err != nil {
		return 0, err
	}
	created := time.Now().UTC().Truncate(time.Second)
	queue := rs.queue("idle")
	ids := make([]string, n)
	if err := publish(ctx, writer.Conn, n, func(i int) *nats.Msg {
		id, doc := workload.IdleSchedule(queue+"-", i, queue, created)
		ids[i] = id
		return &nats.Msg{Subject: "$KV." + protocol.BucketSchedules + "." + id, Data: doc}
	}); err != nil {
		return 0, fmt.Errorf("write definitions: %w", err)
	}
	if err := publish(ctx, writer.Conn, n, func(i int) *nats.Msg {
		// A state as one fire ago leaves it.
		data, _ := json.Marshal(jetfleet.ScheduleState{ScheduleID: ids[i], LastNominal: created, Fires: 1, UpdatedAt: created,
			LastFire: &jetfleet.ScheduleFire{JobID: fmt.Sprintf("sched.%s.%d", ids[i], created.Unix()), NominalTime: created, FiredAt: created}})
		return &nats.Msg{Subject: "$KV." + protocol.BucketScheduleState + "." + ids[i], Data: data}
	}); err != nil {
		return 0, fmt.Errorf("write states: %w", err)
	}
	writer.Conn.Close()

	before := liveHeap()
	s, err := startScheduler(ctx, rs, "scheduler")
	if err != nil {
		return 0, err
	}
	defer func() { _ = s.Stop(context.WithoutCancel(ctx)) }()
	if err := waitGauge(ctx, rs.tel.Registry, "jetfleet_scheduler_schedules", float64(n)); err != nil {
		return 0, err
	}
	for s.Ready(ctx) != nil {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("scheduler not ready: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling the replica's readiness; no event marks it
		}
	}
	after := liveHeap()
	runtime.KeepAlive(s)
	return (after - before) / float64(n), nil
}

// liveHeap is the live heap after a full collection.
func liveHeap() float64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc)
}

// startScheduler starts a scheduler replica on a connection of its own.
func startScheduler(ctx context.Context, rs *runServer, name string) (*scheduler.Scheduler, error) {
	env, err := rs.connect(name)
	if err != nil {
		return nil, err
	}
	s, err := scheduler.New(scheduler.Config{}, env, clock.Real())
	if err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// waitLeader waits until s leads.
func waitLeader(ctx context.Context, s interface{ IsLeader() bool }) error {
	for !s.IsLeader() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the replica to lead: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling the elector; no event marks it
		}
	}
	return nil
}

// waitGauge waits until the gauge name in registry reaches want.
func waitGauge(ctx context.Context, registry *prometheus.Registry, name string, want float64) error {
	for {
		got, err := gaugeValue(registry, name)
		if err != nil {
			return err
		}
		if got >= want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is %.0f, waiting for %.0f: %w", name, got, want, ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling a metric; the bench has no other view of the replica's engine
		}
	}
}

// gaugeValue sums the gauge name over its series.
func gaugeValue(registry *prometheus.Registry, name string) (float64, error) {
	families, err := registry.Gather()
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetGauge().GetValue()
		}
	}
	return sum, nil
}

// OneShots returns n one-shot schedules due at at, named prefix + i,
// publishing jobs of kind on queue, as created at now.
func OneShots(prefix string, n int, at, now time.Time, queue, kind string) []*jetfleet.Schedule {
	out := make([]*jetfleet.Schedule, n)
	for i := range out {
		out[i] = &jetfleet.Schedule{ID: fmt.Sprintf("%s%d", prefix, i), Spec: jetfleet.Spec{At: &at},
			Target: jetfleet.Target{Queue: queue, Kind: kind}, CreatedAt: now, EffectiveFrom: now}
	}
	return out
}

// PutSchedules writes definitions straight into bucket schedules, as the
// scheduler's API stores them, with asynchronous publishes on nc, and
// returns once every write is acknowledged.
func PutSchedules(ctx context.Context, nc *nats.Conn, defs []*jetfleet.Schedule) error {
	docs := make([][]byte, len(defs))
	for i, d := range defs {
		var err error
		if docs[i], err = json.Marshal(d); err != nil {
			return err
		}
	}
	return publish(ctx, nc, len(defs), func(i int) *nats.Msg {
		return &nats.Msg{Subject: "$KV." + protocol.BucketSchedules + "." + defs[i].ID, Data: docs[i]}
	})
}

// Fire is a job a schedule fired, as stored in the JOBS stream.
type Fire struct {
	ScheduleID string
	Nominal    time.Time
	// Stored is when JetStream stored the job (the server's clock).
	Stored time.Time
	// Received is when the collector received it (this process's clock).
	Received time.Time
}

// Delay is the fire's scheduling delay: stored minus nominal time.
func (f Fire) Delay() time.Duration { return f.Stored.Sub(f.Nominal) }

// FireCollector receives every job stored on a queue, as an agent would
// (through the queue's consumer, acking each), and records it as a Fire.
type FireCollector struct {
	cc jetstream.ConsumeContext

	mu    sync.Mutex
	fires []Fire
	err   error
	more  chan struct{} // closed and replaced on every fire
}

// CollectFires starts collecting the jobs of queue as they are stored;
// topo configures its consumer. Stop it when done.
func CollectFires(ctx context.Context, js jetstream.JetStream, topo topology.Config, queue string) (*FireCollector, error) {
	cons, err := topology.EnsureQueue(ctx, js, topo, queue)
	if err != nil {
		return nil, err
	}
	return collect(cons)
}

func collect(cons jetstream.Consumer) (*FireCollector, error) {
	c := &FireCollector{more: make(chan struct{})}
	var err error
	c.cc, err = cons.Consume(c.receive, jetstream.PullMaxMessages(1000))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// StoredFires waits until n jobs of queue are stored, reading none while
// they arrive (a reader would compete with the scheduler for the server
// and delay the fires it measures), then reads and acks n of them and
// returns them as fires; their Received times only say when they were read.
// topo configures the queue's consumer.
func StoredFires(ctx context.Context, js jetstream.JetStream, topo topology.Config, queue string, n int) ([]Fire, error) {
	cons, err := topology.EnsureQueue(ctx, js, topo, queue)
	if err != nil {
		return nil, err
	}
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			return nil, err
		}
		if info.NumPending+uint64(info.NumAckPending) >= uint64(n) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%d of %d fires stored: %w", info.NumPending, n, ctx.Err())
		case <-time.After(20 * time.Millisecond): // polling the stream's count; no event marks it without reading
		}
	}
	c, err := collect(cons)
	if err != nil {
		return nil, err
	}
	defer c.Stop()
	return c.Wait(ctx, n)
}

func (c *FireCollector) receive(m jetstream.Msg) {
	f := Fire{Received: time.Now(), ScheduleID: m.Headers().Get(protocol.HeaderScheduleID)}
	_ = m.Ack()
	md, err := m.Metadata()
	if err == nil {
		f.Stored = md.Timestamp
		f.Nominal, err = time.Parse(time.RFC3339Nano, m.Headers().Get(protocol.HeaderNominalTime))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.err = errors.Join(c.err, fmt.Errorf("job %s: %w", m.Subject(), err))
	}
	c.fires = append(c.fires, f)
	close(c.more)
	c.more = make(chan struct{})
}

// Wait returns the fires collected so far once there are at least n.
func (c *FireCollector) Wait(ctx context.Context, n int) ([]Fire, error) {
	for {
		c.mu.Lock()
		if c.err != nil {
			err := c.err
			c.mu.Unlock()
			return nil, err
		}
		if len(c.fires) >= n {
			out := slices.Clone(c.fires)
			c.mu.Unlock()
			return out, nil
		}
		got, more := len(c.fires), c.more
		c.mu.Unlock()
		select {
		case <-more:
		case <-ctx.Done():
			return nil, fmt.Errorf("%d of %d fires: %w", got, n, ctx.Err())
		}
	}
}

// Stop stops collecting.
func (c *FireCollector) Stop() { c.cc.Stop() }
