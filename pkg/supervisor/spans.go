package supervisor

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// The supervisor's spans continue the trace of the job they act on: a
// rescue, a dead letter, a replay and an escalation each start a span whose
// parent is the job message's traceparent, so the job's trace shows what
// the supervisor did to it beside the agents' attempts. A replayed job
// carries the replay span as its traceparent: its new attempts are the
// replay's children.

const tracerName = "github.com/jetfleet/jetfleet/pkg/supervisor"

func (s *Supervisor) tracer() trace.Tracer {
	if s.env != nil && s.env.Telemetry != nil && s.env.Telemetry.TracerProvider != nil {
		return s.env.Telemetry.TracerProvider.Tracer(tracerName)
	}
	return otel.GetTracerProvider().Tracer(tracerName)
}

// jobSpan starts span name as a child of the trace context in h (a job
// message's headers); without one it starts a trace of its own.
func (s *Supervisor) jobSpan(ctx context.Context, name string, h nats.Header, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if h != nil {
		ctx = telemetry.Extract(ctx, h)
	}
	return s.tracer().Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

func jobAttrs(jobID, queue, kind string, seq uint64) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("jetfleet.job_id", jobID), attribute.String("jetfleet.queue", queue),
		attribute.String("jetfleet.kind", kind), attribute.Int64("jetfleet.stream_sequence", int64(seq))}
}
