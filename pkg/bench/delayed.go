package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
)

// Figures of the delayed scenario.
var (
	figDelayedStoreRate = figureSpec{name: "delayed_store_rate", label: "D delayed jobs stored", unit: UnitRate}
	figServerPerDelayed = figureSpec{name: "server_rss_per_delayed_job", label: "NATS server RSS per stored delayed job",
		unit: UnitBytes}
	figServerPeakRSS = figureSpec{name: "server_peak_rss", label: "NATS server process peak RSS", unit: UnitBytes}
	figFleetHeapNone = figureSpec{name: "fleet_heap_none_delayed", label: "jetfleet agents + supervisor heap, no delayed job",
		unit: UnitBytes}
	figFleetHeapMany = figureSpec{name: "fleet_heap_d_delayed", label: "jetfleet agents + supervisor heap, D delayed jobs stored",
		unit: UnitBytes}
	figPeakRSS        = figureSpec{name: "peak_rss", label: "fleet process peak RSS (agents, supervisor, producer)", unit: UnitBytes}
	figDueLatenessP50 = figureSpec{name: "due_to_start_p50", label: "B due in one second: due → handler start p50", unit: UnitMs}
	figDueLatenessP99 = figureSpec{name: "due_to_start_p99", label: "B due in one second: due → handler start p99", unit: UnitMs}
	figDueLatenessMax = figureSpec{name: "due_to_start_max", label: "B due in one second: due → handler start max", unit: UnitMs}
	figPlainBurstP50  = figureSpec{name: "plain_burst_enqueue_to_start_p50", label: "baseline: B plain jobs in one second, enqueue → start p50",
		unit: UnitMs}
	figPlainBurstP99 = figureSpec{name: "plain_burst_enqueue_to_start_p99", label: "baseline: B plain jobs in one second, enqueue → start p99",
		unit: UnitMs}
)

// headerDueAt carries a bench job's due time (Unix nanoseconds on the
// bench's clock, which the handler shares).
const headerDueAt = "Bench-Due-At"

// delayed stores D delayed jobs due across the hour after the next, then B more due within one
// second, and measures how late each of the B starts; then B plain jobs
// published within one second, the baseline. The embedded server runs in a
// child process, so memory is measured apart: the live heap of this
// process (the agents', the supervisor's, the producer's) with no delayed
// job and with D stored — a delayed job costs them nothing, the server
// keeps it — and the server process's RSS per stored job.
func (b *bencher) delayed(ctx context.Context, run int) error {
	rs, err := b.open(ctx, serverOptions{ownFleet: true, childServer: true})
	if err != nil {
		return err
	}
	defer rs.close(ctx)
	d, burst := b.cfg.DelayedJobs, b.cfg.DelayedBurst
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout(d)+phaseTimeout(2*burst))
	defer cancel()

	heap0 := heapInUse()
	queue := rs.queue("delayed")
	// The delayed jobs due together, then the plain ones: how late each
	// started, by its id's prefix.
	due, plain := newLateness(burst), newLateness(burst)
	handler := func(_ context.Context, job *agent.Job) error {
		at := time.Now()
		stamp, err := strconv.ParseInt(job.Headers.Get(headerDueAt), 10, 64)
		if err != nil {
			return agent.NonRetryable(fmt.Errorf("no %s header: %w", headerDueAt, err))
		}
		l := plain
		if strings.HasPrefix(job.ID, "due-") {
			l = due
		}
		l.add(at.Sub(time.Unix(0, stamp)))
		return nil
	}
	sup, err := b.startSupervisor(ctx, rs)
	if err != nil {
		return err
	}
	stopSup := func() { _ = sup.Stop(context.WithoutCancel(ctx)) }
	defer stopSup()
	fleet, err := newAgents(rs, "agent", queue, kindNoop, b.cfg.Agents, b.cfg.Concurrency, b.cfg.Prefetch, handler)
	if err != nil {
		return err
	}
	stopAgents := func() { _ = fleet.stop(ctx) }
	defer stopAgents()
	if err := fleet.start(ctx); err != nil {
		return err
	}
	heapFleetNone := heapInUse() - heap0

	producer, err := rs.connect("producer")
	if err != nil {
		return err
	}
	payload := workload.Payload(b.cfg.PayloadSize)
	// Due across the hour after the next one, as a real backlog spreads.
	later, spread := time.Now().Add(time.Hour), time.Hour/time.Duration(d)
	var rssBefore int64
	if rs.child != nil {
		rssBefore, _ = rs.child.rss()
	}
	storeStart := time.Now()
	if err := publish(ctx, producer.Conn, d, func(i int) *nats.Msg {
		return delayedMsg(queue, "far-"+strconv.Itoa(i), later.Add(time.Duration(i)*spread), payload)
	}); err != nil {
		return fmt.Errorf("store %d delayed jobs: %w", d, err)
	}
	storeRate := float64(d) / time.Since(storeStart).Seconds()
	var rssStored int64
	if rs.child != nil {
		rssStored, _ = rs.child.rss()
	}

	// B jobs due within one second, from a moment after they are all stored.
	dueAt := time.Now().Add(time.Second + time.Duration(burst)*50*time.Microsecond)
	step := time.Second / time.Duration(burst)
	if err := publish(ctx, producer.Conn, burst, func(i int) *nats.Msg {
		return delayedMsg(queue, "due-"+strconv.Itoa(i), dueAt.Add(time.Duration(i)*step), payload)
	}); err != nil {
		return fmt.Errorf("store %d delayed jobs due together: %w", burst, err)
	}
	dueLateness, err := due.wait(ctx, "delayed jobs started")
	if err != nil {
		return err
	}
	// Baseline: B plain jobs published within one second.
	if _, err := paced(ctx, producer.Conn, queue, burst, burst, payload, headerDueAt); err != nil {
		return err
	}
	plainLateness, err := plain.wait(ctx, "plain jobs started")
	if err != nil {
		return err
	}

	heapWithMany := heapInUse() - heap0

	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.record(ScenarioDelayed, figDelayedStoreRate, storeRate)
	if rs.child != nil {
		_, serverPeak := rs.child.rss()
		b.record(ScenarioDelayed, figServerPerDelayed, float64(rssStored-rssBefore)/float64(d))
		b.record(ScenarioDelayed, figServerPeakRSS, float64(serverPeak))
	}
	b.record(ScenarioDelayed, figFleetHeapNone, float64(heapFleetNone))
	b.record(ScenarioDelayed, figFleetHeapMany, float64(heapWithMany))
	b.record(ScenarioDelayed, figPeakRSS, float64(peakRSS()))
	b.record(ScenarioDelayed, figDueLatenessP50, ms(Percentile(dueLateness, 0.50)))
	b.record(ScenarioDelayed, figDueLatenessP99, ms(Percentile(dueLateness, 0.99)))
	b.record(ScenarioDelayed, figDueLatenessMax, ms(dueLateness[len(dueLateness)-1]))
	b.record(ScenarioDelayed, figPlainBurstP50, ms(Percentile(plainLateness, 0.50)))
	b.record(ScenarioDelayed, figPlainBurstP99, ms(Percentile(plainLateness, 0.99)))
	b.progress("delayed run %d: %d stored at %.0f/s; %d due in one second started p50 %.1f ms, p99 %.1f ms late (plain p99 %.1f ms)",
		run, d, storeRate, burst, ms(Percentile(dueLateness, 0.50)), ms(Percentile(dueLateness, 0.99)), ms(Percentile(plainLateness, 0.99)))
	return nil
}

// lateness collects how late n jobs started.
type lateness struct {
	mu      sync.Mutex
	samples []time.Duration
	started *counter
}

func newLateness(n int) *lateness {
	return &lateness{samples: make([]time.Duration, 0, n), started: &counter{n: int64(n), done: make(chan struct{})}}
}

func (l *lateness) add(d time.Duration) {
	l.mu.Lock()
	l.samples = append(l.samples, d)
	l.mu.Unlock()
	l.started.add(1)
}

// wait returns the samples, sorted, once all n jobs started.
func (l *lateness) wait(ctx context.Context, what string) ([]time.Duration, error) {
	if _, err := l.started.wait(ctx, what); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.samples)
	slices.Sort(out)
	return out, nil
}

// delayedMsg is a delayed no-op job of queue due at dueAt, stamped with it.
func delayedMsg(queue, id string, dueAt time.Time, payload []byte) *nats.Msg {
	msg, err := protocol.Job{ID: id, Queue: queue, Kind: kindNoop, Payload: payload, ProcessAt: dueAt}.Msg()
	if err != nil {
		panic(err) // the bench's own ids and names are valid
	}
	msg.Header.Set(headerDueAt, strconv.FormatInt(dueAt.UnixNano(), 10))
	return msg
}

// startSupervisor starts a supervisor replica on rs and waits until it leads.
func (b *bencher) startSupervisor(ctx context.Context, rs *runServer) (*supervisor.Supervisor, error) {
	env, err := rs.connect("supervisor")
	if err != nil {
		return nil, err
	}
	sup, err := supervisor.New(supervisor.Config{}, env, clock.Real())
	if err != nil {
		return nil, err
	}
	if err := sup.Start(ctx); err != nil {
		return nil, err
	}
	if err := waitLeader(ctx, sup); err != nil {
		_ = sup.Stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("supervisor: %w", err)
	}
	return sup, nil
}

// heapInUse is the process's live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
