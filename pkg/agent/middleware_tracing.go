package agent

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// TracerName is the instrumentation scope of the agent's spans.
const TracerName = "github.com/jetfleet/jetfleet/pkg/agent"

// Tracing runs the job inside a span "agent.execute <kind>" that continues
// the trace of the job message's traceparent header, so the publisher's (or
// the scheduler's) span and the execution are one trace.
func Tracing(tp trace.TracerProvider) Middleware {
	tracer := tp.Tracer(TracerName)
	startOptions := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	return func(next Handler) Handler {
		return func(ctx context.Context, job *Job) error {
			ctx = telemetry.Extract(ctx, job.Headers)
			ctx, span := tracer.Start(ctx, "agent.execute "+job.Kind, startOptions...)
			defer span.End()
			job.TraceID = span.SpanContext().TraceID().String()
			err := next(ctx, job)
			// Set once, at the end, when outcome and attempt are known: the
			// SDK sizes the attribute slice for the first set and copies it
			// for every later one, and exporters read attributes at End.
			span.SetAttributes(
				attribute.String("messaging.system", "nats"),
				attribute.String("messaging.destination.name", "jobs."+job.Queue+"."+job.Kind),
				attribute.String("jetfleet.job_id", job.ID),
				attribute.String("jetfleet.queue", job.Queue),
				attribute.String("jetfleet.kind", job.Kind),
				attribute.Int64("jetfleet.stream_sequence", int64(job.StreamSequence)),
				attribute.Int64("jetfleet.delivered", int64(job.Delivered)),
				attribute.String("jetfleet.outcome", job.Outcome()),
				attribute.Int("jetfleet.attempt", job.Attempt),
			)
			if err != nil && !isType[*SnoozeError](err) {
				span.RecordError(err)
				span.SetStatus(codes.Error, job.Outcome())
			}
			return err
		}
	}
}
