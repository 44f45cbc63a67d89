package agent

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// SchedulingDelay records, for jobs a schedule fired, how long after their
// nominal time their handler started — the delay a user of the schedule
// sees, where the scheduler's own jetfleet_scheduler_delay_seconds stops at
// the publish:
//
//	jetfleet.agent.scheduling_delay (s)   histogram: queue, kind, schedule
//
// Only first attempts count (a retry waits for its backoff on purpose).
// The schedule label takes the first maxDelaySchedules schedule ids an
// agent sees; later ones share the label "_other", so the series stay
// bounded however many schedules the fleet has.
func SchedulingDelay(mp metric.MeterProvider) Middleware {
	meter := mp.Meter(TracerName)
	delay, _ := meter.Float64Histogram("jetfleet.agent.scheduling_delay", metric.WithUnit("s"),
		metric.WithDescription("From a scheduled job's nominal time to its handler's start, first attempts"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
	var labels scheduleLabels
	return func(next Handler) Handler {
		return func(ctx context.Context, job *Job) error {
			if job.ScheduleID != "" && !job.NominalTime.IsZero() && job.Attempt == 1 && job.Delivered <= 1 {
				d := max(time.Since(job.NominalTime), 0)
				delay.Record(ctx, d.Seconds(), metric.WithAttributeSet(attribute.NewSet(
					attribute.String("queue", job.Queue), attribute.String("kind", metricKind(job)),
					attribute.String("schedule", labels.of(job.ScheduleID)))))
			}
			return next(ctx, job)
		}
	}
}

// maxDelaySchedules bounds the schedule labels of one agent.
const maxDelaySchedules = 1000

type scheduleLabels struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (l *scheduleLabels) of(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.seen == nil {
		l.seen = map[string]bool{}
	}
	if l.seen[id] {
		return id
	}
	if len(l.seen) >= maxDelaySchedules {
		return "_other"
	}
	l.seen[id] = true
	return id
}
