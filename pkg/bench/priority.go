package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Figures of the priority scenario.
var (
	figPrioBacklogP50 = figureSpec{name: "high_enqueue_to_start_p50_backlog", label: "high jobs while L low jobs drain: enqueue → start p50",
		unit: UnitMs}
	figPrioBacklogP99 = figureSpec{name: "high_enqueue_to_start_p99_backlog", label: "high jobs while L low jobs drain: enqueue → start p99",
		unit: UnitMs}
	figPrioIdleP50 = figureSpec{name: "high_enqueue_to_start_p50_idle", label: "baseline: high jobs, no backlog: enqueue → start p50",
		unit: UnitMs}
	figPrioIdleP99 = figureSpec{name: "high_enqueue_to_start_p99_idle", label: "baseline: high jobs, no backlog: enqueue → start p99",
		unit: UnitMs}
	figPrioLowDrain = figureSpec{name: "low_drain_rate", label: "L low jobs drained beside the high ones", unit: UnitRate}
)

// priority offers high-priority jobs at Rate per second to K agents while a
// backlog of L low-priority jobs drains from the same queue, and measures
// each high job's enqueue → handler start; then, in the same run on a fresh
// queue, the same high stream with no backlog, the baseline.
func (b *bencher) priority(ctx context.Context, run int) error {
	rs, err := b.open(ctx, serverOptions{})
	if err != nil {
		return err
	}
	defer rs.close(ctx)
	low := b.cfg.PriorityBacklog
	ctx, cancel := context.WithTimeout(ctx, 2*b.cfg.Duration+phaseTimeout(low))
	defer cancel()
	payload := workload.Payload(b.cfg.PayloadSize)
	producer, err := rs.connect("producer")
	if err != nil {
		return err
	}

	withBacklog, lowRate, err := b.highStream(ctx, rs, producer.Conn, rs.queue("prio"), low, payload)
	if err != nil {
		return err
	}
	idle, _, err := b.highStream(ctx, rs, producer.Conn, rs.queue("prio-idle"), 0, payload)
	if err != nil {
		return err
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.record(ScenarioPriority, figPrioBacklogP50, ms(Percentile(withBacklog, 0.50)))
	b.record(ScenarioPriority, figPrioBacklogP99, ms(Percentile(withBacklog, 0.99)))
	b.record(ScenarioPriority, figPrioIdleP50, ms(Percentile(idle, 0.50)))
	b.record(ScenarioPriority, figPrioIdleP99, ms(Percentile(idle, 0.99)))
	b.record(ScenarioPriority, figPrioLowDrain, lowRate)
	b.progress("priority run %d: high p99 %.2f ms beside %d low jobs (%.0f/s), %.2f ms alone", run,
		ms(Percentile(withBacklog, 0.99)), low, lowRate, ms(Percentile(idle, 0.99)))
	return nil
}

// highStream publishes backlog low jobs on queue, starts the agents, and
// offers high jobs at Rate per second while the backlog lasts (for
// Duration when there is none). It returns the high jobs' latencies, sorted
// — only of those published before the last low job started — and the
// low jobs' drain rate.
func (b *bencher) highStream(ctx context.Context, rs *runServer, nc *nats.Conn, queue string, backlog int, payload []byte) ([]time.Duration, float64, error) {
	if backlog > 0 {
		if err := publish(ctx, nc, backlog, func(i int) *nats.Msg {
			msg, _ := protocol.Job{ID: "low-" + strconv.Itoa(i), Queue: queue, Kind: kindNoop, Payload: payload,
				Priority: protocol.PriorityLow}.Msg()
			return msg
		}); err != nil {
			return nil, 0, fmt.Errorf("low backlog: %w", err)
		}
	}
	high := &stamped{more: make(chan struct{}, 1)}
	var lowDone atomic.Int64
	var drainedAt atomic.Int64
	drained := make(chan struct{})
	warmed := make(chan struct{})
	handler := func(_ context.Context, job *agent.Job) error {
		at := time.Now()
		if strings.HasPrefix(job.ID, "warm-") {
			close(warmed)
			return nil
		}
		if strings.HasPrefix(job.ID, "low-") {
			if lowDone.Add(1) == int64(backlog) {
				drainedAt.Store(at.UnixNano())
				close(drained)
			}
			return nil
		}
		published, err := strconv.ParseInt(job.Headers.Get(headerPublishedAt), 10, 64)
		if err != nil {
			return agent.NonRetryable(fmt.Errorf("no %s header: %w", headerPublishedAt, err))
		}
		high.add(time.Unix(0, published), at)
		return nil
	}
	// One high job before the agents start: a priority that had no job yet
	// is dormant until an agent looks (at its start, then every 2 s); the
	// figures are of an awake one.
	warm, _ := protocol.Job{ID: "warm-" + queue, Queue: queue, Kind: kindNoop, Priority: protocol.PriorityHigh}.Msg()
	js, err := newJetStream(nc)
	if err != nil {
		return nil, 0, err
	}
	if _, err := js.PublishMsg(ctx, warm); err != nil {
		return nil, 0, err
	}
	fleet, err := newAgents(rs, "agent", queue, kindNoop, b.cfg.Agents, b.cfg.Concurrency, b.cfg.Prefetch, handler)
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = fleet.stop(ctx) }()
	start := time.Now()
	if err := fleet.start(ctx); err != nil {
		return nil, 0, err
	}
	select {
	case <-warmed:
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("the first high job did not start: %w", ctx.Err())
	}
	// High jobs for Duration, or until the backlog is gone.
	n := max(1, int(float64(b.cfg.Rate)*b.cfg.Duration.Seconds()))
	subject := protocol.JobSubjectAt(queue, kindNoop, protocol.PriorityHigh)
	sent := 0
	for sent < n && (sent == 0 || backlog == 0 || lowDone.Load() < int64(backlog)) {
		chunk := min(b.cfg.Rate/10+1, n-sent) // a tenth of a second at a time
		if _, err := pacedOn(ctx, nc, subject, fmt.Sprintf("%s-high-%d", queue, sent), chunk, b.cfg.Rate, payload, headerPublishedAt); err != nil {
			return nil, 0, err
		}
		sent += chunk
	}
	if err := high.wait(ctx, sent); err != nil {
		return nil, 0, err
	}
	if backlog == 0 {
		return high.latencies(time.Time{}), 0, nil
	}
	select {
	case <-drained:
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("low backlog: %d of %d done: %w", lowDone.Load(), backlog, ctx.Err())
	}
	end := time.Unix(0, drainedAt.Load())
	latencies := high.latencies(end)
	if len(latencies) == 0 {
		return nil, 0, fmt.Errorf("the %d low jobs drained before any high job was published: raise -priority-backlog", backlog)
	}
	return latencies, float64(backlog) / end.Sub(start).Seconds(), nil
}

// stamped collects when jobs were published and when they started.
type stamped struct {
	mu      sync.Mutex
	samples []stampedJob
	more    chan struct{} // signalled at every sample
}

type stampedJob struct{ published, started time.Time }

func (s *stamped) add(published, started time.Time) {
	s.mu.Lock()
	s.samples = append(s.samples, stampedJob{published, started})
	s.mu.Unlock()
	select {
	case s.more <- struct{}{}:
	default:
	}
}

// wait returns once n jobs started.
func (s *stamped) wait(ctx context.Context, n int) error {
	for {
		s.mu.Lock()
		got := len(s.samples)
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-s.more:
		case <-ctx.Done():
			return fmt.Errorf("high jobs: %d of %d started: %w", got, n, ctx.Err())
		}
	}
}

// latencies are the enqueue → start times of the jobs published before
// until (all when zero), sorted.
func (s *stamped) latencies(until time.Time) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []time.Duration
	for _, j := range s.samples {
		if until.IsZero() || j.published.Before(until) {
			out = append(out, j.started.Sub(j.published))
		}
	}
	slices.Sort(out)
	return out
}
