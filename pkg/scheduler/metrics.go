package scheduler

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// metrics are the scheduler's OpenTelemetry instruments (Prometheus names
// in docs/scheduling.md).
type metrics struct {
	delay         metric.Float64Histogram
	fires         metric.Int64Counter
	skips         metric.Int64Counter
	misses        metric.Int64Counter
	duplicates    metric.Int64Counter
	leaderChanges metric.Int64Counter
	loaded        atomic.Int64
	leading       atomic.Int64
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := &metrics{}
	meter := mp.Meter("github.com/jetfleet/jetfleet/pkg/scheduler")
	var err error
	if m.delay, err = meter.Float64Histogram("jetfleet.scheduler.delay",
		metric.WithDescription("Scheduling delay: when a fire was published minus when it was due (nominal time plus jitter)"),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)); err != nil {
		return nil, err
	}
	if m.fires, err = meter.Int64Counter("jetfleet.scheduler.fires",
		metric.WithDescription("Jobs published by schedules, by source (schedule, event, dependency, trigger, backfill)")); err != nil {
		return nil, err
	}
	if m.skips, err = meter.Int64Counter("jetfleet.scheduler.skips",
		metric.WithDescription("Nominal times skipped, by reason")); err != nil {
		return nil, err
	}
	if m.misses, err = meter.Int64Counter("jetfleet.scheduler.misses",
		metric.WithDescription("Nominal times missed after downtime, by reason")); err != nil {
		return nil, err
	}
	if m.duplicates, err = meter.Int64Counter("jetfleet.scheduler.duplicates",
		metric.WithDescription("Fires JetStream rejected as duplicates of an earlier publish (a retry or another leader)")); err != nil {
		return nil, err
	}
	if m.leaderChanges, err = meter.Int64Counter("jetfleet.scheduler.leader_changes",
		metric.WithDescription("Times this replica gained or lost the scheduler leadership")); err != nil {
		return nil, err
	}
	if _, err = meter.Int64ObservableGauge("jetfleet.scheduler.schedules",
		metric.WithDescription("Schedules loaded"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(m.loaded.Load())
			return nil
		})); err != nil {
		return nil, err
	}
	if _, err = meter.Int64ObservableGauge("jetfleet.scheduler.leader",
		metric.WithDescription("1 while this replica is the scheduler leader"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(m.leading.Load())
			return nil
		})); err != nil {
		return nil, err
	}
	return m, nil
}

func reasonAttr(reason string) metric.AddOption {
	return metric.WithAttributes(attribute.String("reason", reason))
}

func sourceAttr(source string) metric.AddOption {
	return metric.WithAttributes(attribute.String("source", source))
}
