package agent

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// runningMetric registers jetfleet.agent.jobs.running (queue, kind): the
// jobs this agent runs now, settling included, counted when metrics are
// collected rather than on every job's start and end. Every queue and
// registered kind reports, 0 when idle, so the series never vanishes.
// Several agents of one process add up under the same labels. The returned
// registration is unregistered when the agent stops.
func (a *Agent) runningMetric() (metric.Registration, error) {
	meter := a.meter.Meter(TracerName)
	running, err := meter.Int64ObservableUpDownCounter("jetfleet.agent.jobs.running",
		metric.WithDescription("Jobs running now, settling included"))
	if err != nil {
		return nil, fmt.Errorf("metric jetfleet.agent.jobs.running: %w", err)
	}
	unconfirmed, err := meter.Int64ObservableUpDownCounter("jetfleet.agent.jobs.unconfirmed",
		metric.WithDescription("Finished jobs whose outcome event the server has not confirmed yet (their ack waits for it)"))
	if err != nil {
		return nil, fmt.Errorf("metric jetfleet.agent.jobs.unconfirmed: %w", err)
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		type series struct{ queue, kind string }
		counts := map[series]int64{}
		for _, q := range a.cfg.Queues {
			for k := range a.kinds {
				counts[series{q, k}] = 0
			}
		}
		a.mu.Lock()
		for _, ex := range a.inflight {
			counts[series{ex.job.Queue, metricKind(&ex.job)}]++
		}
		a.mu.Unlock()
		for s, n := range counts {
			o.ObserveInt64(running, n, metric.WithAttributes(attribute.String("queue", s.queue), attribute.String("kind", s.kind)))
		}
		a.awaitMu.Lock()
		o.ObserveInt64(unconfirmed, int64(len(a.awaiting)))
		a.awaitMu.Unlock()
		return nil
	}, running, unconfirmed)
}
