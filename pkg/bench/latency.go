package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// headerPublishedAt carries the publish time of a latency job (Unix
// nanoseconds on the bench's clock, which the handler shares).
const headerPublishedAt = "Bench-Published-At"

// Figures of the latency scenario.
var (
	figOffered = figureSpec{name: "offered_rate", label: "offered load (achieved)", unit: UnitRate}
	figLatP50  = figureSpec{name: "enqueue_to_start_p50", label: "enqueue → handler start p50", unit: UnitMs}
	figLatP90  = figureSpec{name: "enqueue_to_start_p90", label: "enqueue → handler start p90", unit: UnitMs}
	figLatP99  = figureSpec{name: "enqueue_to_start_p99", label: "enqueue → handler start p99", unit: UnitMs,
		target: &Target{Value: 5}}
	figLatMax = figureSpec{name: "enqueue_to_start_max", label: "enqueue → handler start max", unit: UnitMs}
)

// latency offers Rate jobs per second for Duration to K agents and
// measures, for every job, the time from just before its publish to the
// entry of its handler.
func (b *bencher) latency(ctx context.Context, run int) error {
	rs, err := b.open(ctx, serverOptions{})
	if err != nil {
		return err
	}
	defer rs.close(ctx)
	n := max(1, int(float64(b.cfg.Rate)*b.cfg.Duration.Seconds()))
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Duration+phaseTimeout(n))
	defer cancel()

	queue := rs.queue("latency")
	latencies := make([]time.Duration, n)
	var entered atomic.Int64
	entries := &counter{n: int64(n), done: make(chan struct{})}
	handler := func(_ context.Context, job *agent.Job) error {
		at := time.Now()
		published, err := strconv.ParseInt(job.Headers.Get(headerPublishedAt), 10, 64)
		if err != nil {
			return agent.NonRetryable(fmt.Errorf("no %s header: %w", headerPublishedAt, err))
		}
		if i := entered.Add(1) - 1; i < int64(n) {
			latencies[i] = at.Sub(time.Unix(0, published))
		}
		entries.add(1)
		return nil
	}
	fleet, err := newAgents(rs, "agent", queue, kindNoop, b.cfg.Agents, b.cfg.Concurrency, b.cfg.Prefetch, handler)
	if err != nil {
		return err
	}
	defer func() { _ = fleet.stop(ctx) }()
	if err := fleet.start(ctx); err != nil {
		return err
	}
	producer, err := rs.connect("producer")
	if err != nil {
		return err
	}
	offered, err := paced(ctx, producer.Conn, queue, n, b.cfg.Rate, workload.Payload(b.cfg.PayloadSize), headerPublishedAt)
	if err != nil {
		return err
	}
	if _, err := entries.wait(ctx, "handler entries"); err != nil {
		return err
	}
	slices.Sort(latencies)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.record(ScenarioLatency, figOffered, offered)
	b.record(ScenarioLatency, figLatP50, ms(Percentile(latencies, 0.50)))
	b.record(ScenarioLatency, figLatP90, ms(Percentile(latencies, 0.90)))
	b.record(ScenarioLatency, figLatP99, ms(Percentile(latencies, 0.99)))
	b.record(ScenarioLatency, figLatMax, ms(latencies[len(latencies)-1]))
	b.progress("latency run %d: p50 %.2f ms, p99 %.2f ms at %.0f jobs/s", run,
		ms(Percentile(latencies, 0.50)), ms(Percentile(latencies, 0.99)), offered)
	return nil
}

// paced publishes n jobs at rate per second, each stamped (header stamp)
// with the time just before its publish, without waiting for acks in
// between (a publish late on its slot goes at once), and returns the rate
// achieved.
func paced(ctx context.Context, nc *nats.Conn, queue string, n, perSecond int, payload []byte, stamp string) (float64, error) {
	return pacedOn(ctx, nc, protocol.JobSubject(queue, kindNoop), queue, n, perSecond, payload, stamp)
}

// pacedOn is paced on subject, the job ids <idPrefix>-<i>.
func pacedOn(ctx context.Context, nc *nats.Conn, subject, idPrefix string, n, perSecond int, payload []byte, stamp string) (float64, error) {
	var failed atomic.Int64
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { failed.Add(1) }))
	if err != nil {
		return 0, err
	}
	period := time.Second / time.Duration(perSecond)
	start := time.Now()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(i) * period)); wait > 0 {
			time.Sleep(wait)
		}
		m := &nats.Msg{Subject: subject, Data: payload, Header: nats.Header{
			protocol.HeaderJobID: {fmt.Sprintf("%s-%d", idPrefix, i)},
			protocol.HeaderMsgID: {fmt.Sprintf("%s-%d", idPrefix, i)},
		}}
		m.Header.Set(stamp, strconv.FormatInt(time.Now().UnixNano(), 10))
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			return 0, err
		}
	}
	elapsed := time.Since(start)
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if f := failed.Load(); f > 0 {
		return 0, fmt.Errorf("%d publishes failed", f)
	}
	if n == 1 {
		return float64(perSecond), nil
	}
	// n publishes span n-1 periods.
	return float64(n-1) / elapsed.Seconds(), nil
}

// Percentile returns the p-th percentile (0 ≤ p ≤ 1) of sorted values,
// nearest rank below: the value at index p×(len−1). Zero when empty.
func Percentile[T any](sorted []T, p float64) T {
	var zero T
	if len(sorted) == 0 {
		return zero
	}
	return sorted[int(p*float64(len(sorted)-1))]
}
