package agent

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metrics records, per queue, kind and outcome, how many job attempts ended
// and how long they took:
//
//	jetfleet.agent.job.duration (s)   histogram: queue, kind, outcome
//	jetfleet.agent.jobs               counter:   queue, kind, outcome, error_code
//
// The agent reports the jobs it runs now itself, when metrics are
// collected (jetfleet.agent.jobs.running; see runningMetric), so a job
// costs two measurements and one lookup of their attributes.
func Metrics(mp metric.MeterProvider) Middleware {
	meter := mp.Meter(TracerName)
	duration, _ := meter.Float64Histogram("jetfleet.agent.job.duration", metric.WithUnit("s"),
		metric.WithDescription("Run time of job attempts, settling included (event and ack sent)"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800))
	jobs, _ := meter.Int64Counter("jetfleet.agent.jobs", metric.WithDescription("Job attempts by outcome"))
	var sets attrCache
	return func(next Handler) Handler {
		return func(ctx context.Context, job *Job) error {
			start := time.Now()
			err := next(ctx, job)
			opts := sets.get(job.Queue, metricKind(job), job.Outcome(), job.errorCode)
			duration.Record(ctx, time.Since(start).Seconds(), opts.record...)
			jobs.Add(ctx, 1, opts.add...)
			return err
		}
	}
}

// unknownKindLabel stands for every kind the agent does not run. Queues are
// the agent's own, so they need no such guard.
const unknownKindLabel = "_unknown"

// metricKind is the kind label of job: its kind, or unknownKindLabel, so a
// stream of made-up kinds cannot grow the metrics without bound.
func metricKind(job *Job) string {
	if !job.registered {
		return unknownKindLabel
	}
	return job.Kind
}

// attrCache keeps the attribute sets of one label combination, as the
// ready-made options Record and Add take, so recording a job costs no
// allocation. Labels are few: queues × kinds × outcomes × codes.
type attrCache struct{ m sync.Map }

type attrKey struct{ queue, kind, outcome, code string }

// attrOptions are the options of one combination: record carries queue,
// kind and outcome (the duration histogram); add carries the error code too.
type attrOptions struct {
	record []metric.RecordOption
	add    []metric.AddOption
}

func (c *attrCache) get(queue, kind, outcome, code string) *attrOptions {
	key := attrKey{queue, kind, outcome, code}
	if opts, ok := c.m.Load(key); ok {
		return opts.(*attrOptions)
	}
	labels := []attribute.KeyValue{attribute.String("queue", queue), attribute.String("kind", kind), attribute.String("outcome", outcome)}
	opts := &attrOptions{
		record: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(labels...))},
		add:    []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append(labels, attribute.String("error_code", code))...))},
	}
	c.m.Store(key, opts)
	return opts
}
