package telemetry

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator is W3C trace context; its keys are lowercase and stay so,
// because NATS headers are case-sensitive and never canonicalised here.
var propagator = propagation.TraceContext{}

// HeaderCarrier adapts nats.Header to the propagation API without touching
// the case of keys.
type HeaderCarrier nats.Header

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the keys.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the span context of ctx into h as traceparent/tracestate.
func Inject(ctx context.Context, h nats.Header) {
	propagator.Inject(ctx, HeaderCarrier(h))
}

// Extract returns ctx carrying the remote span context found in h, if any.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return propagator.Extract(ctx, HeaderCarrier(h))
}

// TraceID returns the trace id of ctx's span, or "" when there is none.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
