package bench

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Figures of the throughput scenario.
var (
	figEnqueueRaw   = figureSpec{name: "enqueue_rate_raw", label: "enqueue, raw JetStream publish", unit: UnitRate}
	figEnqueue      = figureSpec{name: "enqueue_rate", label: "enqueue, jetfleet job (job id, dedupe)", unit: UnitRate}
	figEnqueueRatio = figureSpec{name: "enqueue_ratio", label: "enqueue, jetfleet / raw", unit: UnitRatio}
	figDrainRaw     = figureSpec{name: "drain_rate_raw", label: "drain, raw pull consumer", unit: UnitRate}
	figDrainRawEv   = figureSpec{name: "drain_rate_raw_event", label: "drain, raw + 1 stored event per job", unit: UnitRate}
	figDrain        = figureSpec{name: "drain_rate", label: "drain, jetfleet agents", unit: UnitRate}
	figDrainRatio   = figureSpec{name: "drain_ratio", label: "drain, jetfleet / raw", unit: UnitRatio}
	figDrainCPURaw  = figureSpec{name: "drain_cpu_per_job_raw", label: "drain, process CPU per job, raw", unit: UnitUs}
	figDrainCPUEv   = figureSpec{name: "drain_cpu_per_job_raw_event", label: "drain, process CPU per job, raw + 1 event", unit: UnitUs}
	figDrainCPU     = figureSpec{name: "drain_cpu_per_job", label: "drain, process CPU per job, jetfleet", unit: UnitUs}
	figE2ERaw       = figureSpec{name: "end_to_end_rate_raw", label: "end to end, raw", unit: UnitRate}
	figE2ERawEv     = figureSpec{name: "end_to_end_rate_raw_event", label: "end to end, raw + 1 stored event per job", unit: UnitRate}
	figE2ECeiling   = figureSpec{name: "end_to_end_ratio_raw_event", label: "end to end, (raw + 1 event) / raw", unit: UnitRatio}
	figE2E          = figureSpec{name: "end_to_end_rate", label: "end to end, jetfleet", unit: UnitRate}
	figE2ERatio     = figureSpec{name: "end_to_end_ratio", label: "end to end, jetfleet / raw", unit: UnitRatio,
		target: &Target{AtLeast: true, Value: 0.7}}
)

// throughput measures one run: enqueue, drain and end-to-end rates of
// jetfleet agents and of the raw baseline, on one server, side by side.
// A second baseline, raw + 1 stored event per job, shows the ceiling of a
// design that stores one event per job, as jetfleet does.
func (b *bencher) throughput(ctx context.Context, run int) error {
	rs, err := b.open(ctx, serverOptions{})
	if err != nil {
		return err
	}
	defer rs.close(ctx)
	tp := &throughputRun{b: b, rs: rs, n: b.cfg.Jobs, payload: workload.Payload(b.cfg.PayloadSize), prefetch: b.cfg.Prefetch}
	if err := tp.setup(); err != nil {
		return err
	}
	rawQ, rawEvQ, ourQ := rs.queue("raw"), rs.queue("rawev"), rs.queue("jobs")

	// Enqueue: a raw JetStream publish of the payload alone, and jetfleet
	// job messages. Every consumer line then runs on the same jetfleet job
	// messages, so the ratios measure the consumers, not the job format,
	// whose cost (a header and JetStream's duplicate check, for producer
	// and server alike) the enqueue ratio shows.
	publishQ := rs.queue("publish")
	rawEnq, err := tp.enqueue(ctx, "raw", tp.rawMsg(publishQ))
	if err != nil {
		return err
	}
	if err := tp.purge(ctx, publishQ); err != nil { // nothing consumes them
		return err
	}
	ourEnq, err := tp.enqueue(ctx, "jetfleet", tp.jobMsg(ourQ))
	if err != nil {
		return err
	}
	for _, q := range []string{rawQ, rawEvQ} {
		if _, err := tp.enqueue(ctx, "jetfleet", tp.jobMsg(q)); err != nil {
			return err
		}
	}
	b.record(ScenarioThroughput, figEnqueueRaw, rawEnq)
	b.record(ScenarioThroughput, figEnqueue, ourEnq)
	b.record(ScenarioThroughput, figEnqueueRatio, ourEnq/rawEnq)

	cpu0 := ProcessCPU()
	rawDrain, err := tp.rawRate(ctx, rawQ, false, false)
	if err != nil {
		return fmt.Errorf("raw drain: %w", err)
	}
	cpu1 := ProcessCPU()
	rawEvDrain, err := tp.rawRate(ctx, rawEvQ, false, true)
	if err != nil {
		return fmt.Errorf("raw + event drain: %w", err)
	}
	cpu2 := ProcessCPU()
	ourDrain, err := tp.agentRate(ctx, ourQ, false)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	cpu3 := ProcessCPU()
	b.record(ScenarioThroughput, figDrainRaw, rawDrain)
	b.record(ScenarioThroughput, figDrainRawEv, rawEvDrain)
	b.record(ScenarioThroughput, figDrain, ourDrain)
	b.record(ScenarioThroughput, figDrainRatio, ourDrain/rawDrain)
	if cpu3 > 0 {
		perJob := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(tp.n) }
		b.record(ScenarioThroughput, figDrainCPURaw, perJob(cpu1-cpu0))
		b.record(ScenarioThroughput, figDrainCPUEv, perJob(cpu2-cpu1))
		b.record(ScenarioThroughput, figDrainCPU, perJob(cpu3-cpu2))
	}

	rawE2E, rawEvE2E, ourE2E, err := tp.endToEnd(ctx)
	if err != nil {
		return err
	}
	b.record(ScenarioThroughput, figE2ERaw, rawE2E)
	b.record(ScenarioThroughput, figE2ERawEv, rawEvE2E)
	b.record(ScenarioThroughput, figE2E, ourE2E)
	b.record(ScenarioThroughput, figE2ERatio, ourE2E/rawE2E)
	b.record(ScenarioThroughput, figE2ECeiling, rawEvE2E/rawE2E)
	b.progress("throughput run %d: end to end %s jobs/s, raw %s jobs/s (%.2f×)", run,
		formatValue(ourE2E, UnitRate), formatValue(rawE2E, UnitRate), ourE2E/rawE2E)
	return nil
}

// endToEnd measures the end-to-end rate of the raw baseline, of raw + 1
// stored event per job, and of jetfleet agents, each twice, in the mirrored
// order raw, raw + event, jetfleet, jetfleet, raw + event, raw; each rate is
// the mean of its two phases. Measured once each, in a fixed order, a line
// run later paid for it: on a 2-core machine a raw line's second phase ran
// 4% slower than its first (the machine's speed drifts during a run, and
// the server's stores grow), and jetfleet's line ran last. Mirrored, every
// line sits at the same mean position, and a drift that is linear in time
// cancels out of the ratios.
func (tp *throughputRun) endToEnd(ctx context.Context) (raw, rawEvent, jetfleet float64, err error) {
	rates, err := mirrored([]rateLine{
		{name: "raw", rate: func() (float64, error) { return tp.rawRate(ctx, tp.rs.queue("raw"), true, false) }},
		{name: "raw + event", rate: func() (float64, error) { return tp.rawRate(ctx, tp.rs.queue("rawev"), true, true) }},
		{name: "jetfleet", rate: func() (float64, error) { return tp.agentRate(ctx, tp.rs.queue("jobs"), true) }},
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return rates[0], rates[1], rates[2], nil
}

// rateLine is one line of a mirrored measurement: a phase that returns a
// rate, run twice.
type rateLine struct {
	name string
	rate func() (float64, error)
}

// mirrored runs the lines in order, then in reverse, and returns each
// line's mean rate, in the lines' order (see endToEnd for why).
func mirrored(lines []rateLine) ([]float64, error) {
	means := make([]float64, len(lines))
	order := make([]int, 0, 2*len(lines))
	for i := range lines {
		order = append(order, i)
	}
	for i := range lines {
		order = append(order, len(lines)-1-i)
	}
	for _, i := range order {
		r, err := lines[i].rate()
		if err != nil {
			return nil, fmt.Errorf("%s end to end: %w", lines[i].name, err)
		}
		means[i] += r / 2
	}
	return means, nil
}

// throughputRun holds what the phases of one throughput run share.
type throughputRun struct {
	b        *bencher
	rs       *runServer
	n        int
	payload  []byte
	producer *nats.Conn // publishes every job
	observer *nats.Conn // counts events
	// perJob is the time a phase allows per job beyond its first minute.
	// Defaults to phaseTimeout's (2 ms).
	perJob time.Duration
	// prefetch is the agents' agent.prefetch.
	prefetch int
	// countWrites makes each phase tally the streams' writes per job into
	// rawWrites and agentWrites (the durability scenario's figures).
	countWrites            bool
	rawWrites, agentWrites storeWrites
	// followHeap makes each end-to-end phase record the most the heap grew
	// (heapPeak) into rawHeap and agentHeap: the larger of a line's phases.
	followHeap         bool
	rawHeap, agentHeap float64
	// agentStop is the longest the agents' Stop took after a phase (its
	// grace in the bench is 30 s, past which the run fails).
	agentStop time.Duration
}

// heapPeak starts following the live heap of a phase, if the run asks for
// it; the returned func records the most it grew over its size at the
// start into into. A server in the bench's process (not a child server)
// grows the heap too: compare the figure between the lines of one run.
func (tp *throughputRun) heapPeak(into *float64) func() {
	if !tp.followHeap {
		return func() {}
	}
	base := liveHeap()
	h := startHeapPeak()
	return func() { *into = max(*into, float64(h.stop())-base) }
}

// timeout bounds one phase of the run.
func (tp *throughputRun) timeout() time.Duration {
	if tp.perJob > 0 {
		return time.Minute + time.Duration(tp.n)*tp.perJob
	}
	return phaseTimeout(tp.n)
}

func (tp *throughputRun) setup() error {
	p, err := tp.rs.connect("producer")
	if err != nil {
		return err
	}
	o, err := tp.rs.connect("observer")
	if err != nil {
		return err
	}
	tp.producer, tp.observer = p.Conn, o.Conn
	return nil
}

// rawMsg publishes the payload alone, as a raw JetStream producer would:
// the baseline of the enqueue figures.
func (tp *throughputRun) rawMsg(queue string) func(i int) *nats.Msg {
	subject := protocol.JobSubject(queue, kindNoop)
	return func(int) *nats.Msg { return &nats.Msg{Subject: subject, Data: tp.payload} }
}

// jobMsg publishes a jetfleet job with an id: Jetfleet-Job-Id and
// Nats-Msg-Id, so JetStream drops a duplicate.
func (tp *throughputRun) jobMsg(queue string) func(i int) *nats.Msg {
	return func(i int) *nats.Msg {
		m, err := protocol.Job{ID: fmt.Sprintf("%s-%d", queue, i), Queue: queue, Kind: kindNoop, Payload: tp.payload}.Msg()
		if err != nil {
			panic(err) // the queue, kind and id are valid by construction
		}
		return m
	}
}

// enqueue times publishing n messages and waiting for their acks.
func (tp *throughputRun) enqueue(ctx context.Context, what string, msg func(int) *nats.Msg) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, tp.timeout())
	defer cancel()
	runtime.GC()
	start := time.Now()
	if err := publish(ctx, tp.producer, tp.n, msg); err != nil {
		return 0, fmt.Errorf("%s enqueue: %w", what, err)
	}
	return rate(tp.n, time.Since(start)), nil
}

// purge removes queue's jobs from the stream.
func (tp *throughputRun) purge(ctx context.Context, queue string) error {
	js, err := newJetStream(tp.producer)
	if err != nil {
		return err
	}
	jobs, err := js.Stream(ctx, protocol.StreamJobs)
	if err != nil {
		return err
	}
	if err := jobs.Purge(ctx, jetstream.WithPurgeSubject(protocol.QueueAllSubjects(queue))); err != nil {
		return fmt.Errorf("purge queue %s: %w", queue, err)
	}
	return nil
}

// rawRate times the raw baseline acking n jobs of queue (with withEvent,
// storing an event for each): a drain of the jobs already in it, or, with
// produce, jobs published once the consumers wait for them.
func (tp *throughputRun) rawRate(ctx context.Context, queue string, produce, withEvent bool) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, tp.timeout())
	defer cancel()
	js, err := newJetStream(tp.producer)
	if err != nil {
		return 0, err
	}
	raw, err := newRaw(ctx, tp.rs, js, queue, tp.b.cfg.Agents, tp.b.cfg.Concurrency, tp.n, withEvent)
	if err != nil {
		return 0, err
	}
	defer raw.stop()
	tally, err := tp.tally(ctx, js)
	if err != nil {
		return 0, err
	}
	runtime.GC()
	endHeap := tp.heapPeak(&tp.rawHeap)
	var start time.Time
	if produce {
		if err := raw.start(ctx); err != nil {
			return 0, err
		}
		start = time.Now()
		if err := publish(ctx, tp.producer, tp.n, tp.jobMsg(queue)); err != nil {
			return 0, err
		}
	} else {
		start = time.Now()
		if err := raw.start(ctx); err != nil {
			return 0, err
		}
	}
	end, err := raw.wait(ctx)
	if err != nil {
		return 0, err
	}
	if err := waitQueueEmpty(ctx, js, queue); err != nil {
		return 0, err
	}
	endHeap()
	if tp.rawWrites, err = tally.writes(ctx, tp.n); err != nil {
		return 0, err
	}
	return rate(tp.n, end.Sub(start)), nil
}

// agentRate times K agents running n no-op jobs of queue: a drain of the
// jobs already in it, or, with produce, jobs published once the agents wait
// for them. The run ends when the n-th handler has returned and the queue's
// consumer holds no job unacknowledged: every ack is confirmed, as in the
// raw baseline. (Counting succeeded events instead would add a delivery per
// job to the server's work, which the baseline does not have.)
func (tp *throughputRun) agentRate(ctx context.Context, queue string, produce bool) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, tp.timeout())
	defer cancel()
	handled := &counter{n: int64(tp.n), done: make(chan struct{})}
	fleet, err := newAgents(tp.rs, "agent", queue, kindNoop, tp.b.cfg.Agents, tp.b.cfg.Concurrency, tp.prefetch,
		func(context.Context, *agent.Job) error {
			handled.add(1)
			return nil
		})
	if err != nil {
		return 0, err
	}
	defer func() { _ = fleet.stop(ctx) }()
	js, err := newJetStream(tp.observer)
	if err != nil {
		return 0, err
	}
	tally, err := tp.tally(ctx, js)
	if err != nil {
		return 0, err
	}
	runtime.GC()
	endHeap := tp.heapPeak(&tp.agentHeap)
	var start time.Time
	if produce {
		if err := fleet.start(ctx); err != nil {
			return 0, err
		}
		start = time.Now()
		if err := publish(ctx, tp.producer, tp.n, tp.jobMsg(queue)); err != nil {
			return 0, err
		}
	} else {
		start = time.Now()
		if err := fleet.start(ctx); err != nil {
			return 0, err
		}
	}
	if _, err := handled.wait(ctx, "handled jobs"); err != nil {
		return 0, err
	}
	if err := waitQueueEmpty(ctx, js, queue); err != nil {
		return 0, err
	}
	end := time.Now()
	if err := fleet.stop(ctx); err != nil {
		return 0, fmt.Errorf("stop agents: %w", err)
	}
	tp.agentStop = max(tp.agentStop, time.Since(end))
	endHeap() // after Stop: what the agents held until their last events were stored counts
	// After Stop: the agents' last events and acks are stored.
	if tp.agentWrites, err = tally.writes(ctx, tp.n); err != nil {
		return 0, err
	}
	return rate(tp.n, end.Sub(start)), nil
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }
