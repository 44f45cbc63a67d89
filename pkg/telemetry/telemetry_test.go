package telemetry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

func setup(t *testing.T) (*telemetry.Telemetry, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "test", SpanExporter: exp})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	return tel, exp
}

func TestPropagationUsesLowercaseHeaders(t *testing.T) {
	t.Parallel()
	tel, exp := setup(t)
	ctx, span := tel.TracerProvider.Tracer("t").Start(context.Background(), "publish")
	h := nats.Header{}
	telemetry.Inject(ctx, h)
	span.End()
	require.Len(t, h["traceparent"], 1, "key stays lowercase: %v", h)
	assert.Empty(t, h["Traceparent"])

	remote := telemetry.Extract(context.Background(), h)
	_, child := tel.TracerProvider.Tracer("t").Start(remote, "execute")
	child.End()
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	assert.Equal(t, spans[0].SpanContext.TraceID(), spans[1].SpanContext.TraceID())
	assert.Equal(t, spans[0].SpanContext.SpanID(), spans[1].Parent.SpanID())
	assert.Equal(t, span.SpanContext().TraceID().String(), telemetry.TraceID(ctx))
	assert.Equal(t, "", telemetry.TraceID(context.Background()))
}

func TestLoggerAddsTraceID(t *testing.T) {
	t.Parallel()
	tel, _ := setup(t)
	var buf bytes.Buffer
	logger, err := telemetry.NewLogger(&buf, telemetry.Config{})
	require.NoError(t, err)
	ctx, span := tel.TracerProvider.Tracer("t").Start(context.Background(), "op")
	defer span.End()
	logger.InfoContext(ctx, "hello", telemetry.LogJobID, "j1")
	var rec map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &rec))
	assert.Equal(t, span.SpanContext().TraceID().String(), rec["trace_id"])
	assert.Equal(t, "j1", rec["job_id"])

	_, err = telemetry.NewLogger(io.Discard, telemetry.Config{LogLevel: "loud"})
	assert.Error(t, err)
	assert.ErrorContains(t, telemetry.Config{LogFormat: "xml"}.Validate("agent.telemetry"), "agent.telemetry.log_format")
}

func TestOTLPProtocolMustBeHTTP(t *testing.T) {
	t.Parallel()
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
	_, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "x", Getenv: func(k string) string { return env[k] }})
	assert.ErrorContains(t, err, "OTEL_EXPORTER_OTLP_PROTOCOL")
}

func TestHTTPServerEndpoints(t *testing.T) {
	t.Parallel()
	tel, _ := setup(t)
	counter, err := tel.MeterProvider.Meter("t").Int64Counter("jetfleet.test.things")
	require.NoError(t, err)
	counter.Add(context.Background(), 3)

	srv := telemetry.NewHTTPServer("127.0.0.1:0", tel.Registry, slog.New(slog.NewTextHandler(io.Discard, nil)))
	notReady := errors.New("nats disconnected")
	var ready error = notReady
	srv.AddReadyCheck("nats", func(context.Context) error { return ready })
	require.NoError(t, srv.Start(context.Background()))
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	base := "http://" + srv.Addr()

	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, _ := get("/healthz")
	assert.Equal(t, 200, code)
	code, body := get("/readyz")
	assert.Equal(t, 503, code)
	assert.Contains(t, body, "nats: nats disconnected")
	ready = nil
	code, _ = get("/readyz")
	assert.Equal(t, 200, code)
	code, body = get("/metrics")
	assert.Equal(t, 200, code)
	assert.True(t, strings.Contains(body, "jetfleet_test_things_total 3"), body)
}

// TestExemplarsOffUnlessAsked: /metrics has no exemplars to serve, so
// measurements inside a sampled span leave none behind by default;
// OTEL_METRICS_EXEMPLAR_FILTER still turns them on, and a value it does not
// know is an error naming the variable.
func TestExemplarsOffUnlessAsked(t *testing.T) {
	t.Parallel()
	exemplars := func(filter string) int {
		tel, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "test",
			SpanExporter: tracetest.NewInMemoryExporter(),
			Getenv:       func(k string) string { return map[string]string{"OTEL_METRICS_EXEMPLAR_FILTER": filter}[k] }})
		require.NoError(t, err)
		defer func() { _ = tel.Shutdown(context.Background()) }()
		ctx, span := tel.TracerProvider.Tracer("t").Start(context.Background(), "job")
		counter, err := tel.MeterProvider.Meter("t").Int64Counter("jobs")
		require.NoError(t, err)
		counter.Add(ctx, 1)
		span.End()
		families, err := tel.Registry.Gather()
		require.NoError(t, err)
		n := 0
		for _, mf := range families {
			if mf.GetName() != "jobs_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				require.Equal(t, 1.0, m.GetCounter().GetValue())
				if m.GetCounter().GetExemplar() != nil {
					n++
				}
			}
		}
		return n
	}
	assert.Equal(t, 0, exemplars(""), "off by default")
	assert.Equal(t, 1, exemplars("trace_based"), "the variable rules")

	_, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "x",
		Getenv: func(k string) string { return map[string]string{"OTEL_METRICS_EXEMPLAR_FILTER": "sometimes"}[k] }})
	assert.ErrorContains(t, err, "OTEL_METRICS_EXEMPLAR_FILTER")
}
