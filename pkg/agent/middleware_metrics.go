package agent

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metrics records, per queue, kind and outcome, how many jobs ended and how
// long they took, and how many run right now:
//
//	jetfleet.agent.job.duration (s)   histogram: queue, kind, outcome
//	jetfleet.agent.jobs               counter:   queue, kind, outcome, error_code
//	jetfleet.agent.jobs.running       gauge:     queue, kind
func Metrics(mp metric.MeterProvider) Middleware {
	meter := mp.Meter(TracerName)
	duration, _ := meter.Float64Histogram("jetfleet.agent.job.duration", metric.WithUnit("s"),
		metric.WithDescription("Run time of job attempts, settling included (event and ack sent)"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800))
	jobs, _ := meter.Int64Counter("jetfleet.agent.jobs", metric.WithDescription("Job attempts by outcome"))
	running, _ := meter.Int64UpDownCounter("jetfleet.agent.jobs.running", metric.WithDescription("Jobs running now"))
	var sets attrCache
	return func(next Handler) Handler {
		return func(ctx context.Context, job *Job) error {
			kind := job.Kind
			if !job.registered {
				kind = unknownKindLabel
			}
			kindAttrs := sets.get(job.Queue, kind, "", "")
			running.Add(ctx, 1, kindAttrs.add...)
			start := time.Now()
			err := next(ctx, job)
			running.Add(ctx, -1, kindAttrs.add...)
			duration.Record(ctx, time.Since(start).Seconds(), sets.get(job.Queue, kind, job.Outcome(), "-").record...)
			jobs.Add(ctx, 1, sets.get(job.Queue, kind, job.Outcome(), job.errorCode).add...)
			return err
		}
	}
}

// unknownKindLabel stands for every kind the agent does not run. Queues are
// the agent's own, so they need no such guard.
const unknownKindLabel = "_unknown"

// attrCache keeps one attribute set per label combination, as ready-made
// option lists, so recording a job costs no allocation. Labels are few:
// queues × kinds × outcomes × codes.
type attrCache struct{ m sync.Map }

type attrKey struct{ queue, kind, outcome, code string }

// attrOptions is one label combination as the options Add and Record take.
type attrOptions struct {
	add    []metric.AddOption
	record []metric.RecordOption
}

// get returns the options for the labels; outcome "" leaves outcome and
// code out, code "-" leaves the code out.
func (c *attrCache) get(queue, kind, outcome, code string) *attrOptions {
	key := attrKey{queue, kind, outcome, code}
	if opts, ok := c.m.Load(key); ok {
		return opts.(*attrOptions)
	}
	attrs := []attribute.KeyValue{attribute.String("queue", queue), attribute.String("kind", kind)}
	if outcome != "" {
		attrs = append(attrs, attribute.String("outcome", outcome))
		if code != "-" {
			attrs = append(attrs, attribute.String("error_code", code))
		}
	}
	opt := metric.WithAttributeSet(attribute.NewSet(attrs...))
	opts := &attrOptions{add: []metric.AddOption{opt}, record: []metric.RecordOption{opt}}
	c.m.Store(key, opts)
	return opts
}
