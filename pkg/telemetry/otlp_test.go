package telemetry_test

import (
	"compress/gzip"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// otlpReceiver is an OTLP/HTTP endpoint that decodes what it receives: an
// ExportTraceServiceRequest is field 1 (resource_spans) repeated.
type otlpReceiver struct {
	mu       sync.Mutex
	requests []*http.Request
	times    []time.Time
	spans    []*tracepb.ResourceSpans
	// failFirst answers the first n requests with 503.
	failFirst int
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, req)
	r.times = append(r.times, time.Now())
	if len(r.requests) <= r.failFirst {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			http.Error(w, "not an ExportTraceServiceRequest", http.StatusBadRequest)
			return
		}
		b = b[n:]
		msg, n := protowire.ConsumeBytes(b)
		if n < 0 {
			http.Error(w, "truncated", http.StatusBadRequest)
			return
		}
		b = b[n:]
		var rs tracepb.ResourceSpans
		if err := proto.Unmarshal(msg, &rs); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.spans = append(r.spans, &rs)
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
}

func (r *otlpReceiver) received() ([]*http.Request, []*tracepb.ResourceSpans) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*http.Request(nil), r.requests...), append([]*tracepb.ResourceSpans(nil), r.spans...)
}

// exportThroughSetup starts the providers with env, ends a parent and a
// child span, and shuts down, which flushes the batch to the receiver.
func exportThroughSetup(t *testing.T, env map[string]string) (parent, child trace.SpanContext) {
	t.Helper()
	tel, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "otlp-test",
		Getenv: func(k string) string { return env[k] }})
	require.NoError(t, err)
	tracer := tel.TracerProvider.Tracer("jetfleet/test", trace.WithInstrumentationVersion("1.2.3"))
	ctx, p := tracer.Start(context.Background(), "agent.execute echo", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("jetfleet.job_id", "j1"), attribute.Int("jetfleet.attempt", 2),
			attribute.Bool("ok", true), attribute.Float64("ratio", 0.5), attribute.StringSlice("tags", []string{"a", "b"})))
	p.AddEvent("retrying", trace.WithAttributes(attribute.Int64("backoff_ms", 500)))
	_, c := tracer.Start(ctx, "handler", trace.WithLinks(trace.Link{SpanContext: p.SpanContext()}))
	c.SetStatus(codes.Error, "boom")
	c.End()
	p.End()
	require.NoError(t, tel.Shutdown(context.Background()))
	return p.SpanContext(), c.SpanContext()
}

func TestOTLPExporterSendsSpansAsTheProtocolSays(t *testing.T) {
	t.Parallel()
	recv := &otlpReceiver{failFirst: 1} // one retryable answer first
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	parent, child := exportThroughSetup(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":    srv.URL + "/base/",
		"OTEL_EXPORTER_OTLP_HEADERS":     "authorization=Bearer%20s3cret, x-tenant = fleet,",
		"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
	})

	requests, resources := recv.received()
	require.Len(t, requests, 2, "the 503 is retried")
	assert.GreaterOrEqual(t, recv.times[1].Sub(recv.times[0]), time.Second, "after the Retry-After it asked for")
	for _, req := range requests {
		assert.Equal(t, "/base/v1/traces", req.URL.Path)
		assert.Equal(t, "application/x-protobuf", req.Header.Get("Content-Type"))
		assert.Equal(t, "gzip", req.Header.Get("Content-Encoding"))
		assert.Equal(t, "Bearer s3cret", req.Header.Get("Authorization"))
		assert.Equal(t, "fleet", req.Header.Get("X-Tenant"))
	}
	require.Len(t, resources, 1)
	serviceName := ""
	for _, kv := range resources[0].GetResource().GetAttributes() {
		if kv.GetKey() == "service.name" {
			serviceName = kv.GetValue().GetStringValue()
		}
	}
	assert.Equal(t, "otlp-test", serviceName)
	require.Len(t, resources[0].GetScopeSpans(), 1)
	scope := resources[0].GetScopeSpans()[0]
	assert.Equal(t, "jetfleet/test", scope.GetScope().GetName())
	assert.Equal(t, "1.2.3", scope.GetScope().GetVersion())
	require.Len(t, scope.GetSpans(), 2)
	byName := map[string]*tracepb.Span{}
	for _, s := range scope.GetSpans() {
		byName[s.GetName()] = s
	}

	p := byName["agent.execute echo"]
	require.NotNil(t, p)
	pTrace, pSpan := parent.TraceID(), parent.SpanID()
	assert.Equal(t, pTrace[:], p.GetTraceId())
	assert.Equal(t, pSpan[:], p.GetSpanId())
	assert.Empty(t, p.GetParentSpanId())
	assert.Equal(t, tracepb.Span_SPAN_KIND_CONSUMER, p.GetKind())
	assert.Equal(t, tracepb.Status_STATUS_CODE_UNSET, p.GetStatus().GetCode())
	assert.Positive(t, p.GetStartTimeUnixNano())
	assert.GreaterOrEqual(t, p.GetEndTimeUnixNano(), p.GetStartTimeUnixNano())
	attrs := map[string]*commonpb.AnyValue{}
	for _, kv := range p.GetAttributes() {
		attrs[kv.GetKey()] = kv.GetValue()
	}
	assert.Equal(t, "j1", attrs["jetfleet.job_id"].GetStringValue())
	assert.Equal(t, int64(2), attrs["jetfleet.attempt"].GetIntValue())
	assert.True(t, attrs["ok"].GetBoolValue())
	assert.InDelta(t, 0.5, attrs["ratio"].GetDoubleValue(), 0)
	require.Len(t, attrs["tags"].GetArrayValue().GetValues(), 2)
	assert.Equal(t, "b", attrs["tags"].GetArrayValue().GetValues()[1].GetStringValue())
	require.Len(t, p.GetEvents(), 1)
	assert.Equal(t, "retrying", p.GetEvents()[0].GetName())
	assert.Equal(t, int64(500), p.GetEvents()[0].GetAttributes()[0].GetValue().GetIntValue())

	c := byName["handler"]
	require.NotNil(t, c)
	cSpan := child.SpanID()
	assert.Equal(t, pTrace[:], c.GetTraceId())
	assert.Equal(t, cSpan[:], c.GetSpanId())
	assert.Equal(t, pSpan[:], c.GetParentSpanId())
	assert.Equal(t, tracepb.Span_SPAN_KIND_INTERNAL, c.GetKind())
	assert.Equal(t, tracepb.Status_STATUS_CODE_ERROR, c.GetStatus().GetCode())
	assert.Equal(t, "boom", c.GetStatus().GetMessage())
	require.Len(t, c.GetLinks(), 1)
	assert.Equal(t, pSpan[:], c.GetLinks()[0].GetSpanId())
	assert.Equal(t, uint32(trace.FlagsSampled), c.GetFlags()&0xff, "W3C trace flags")
}

func TestOTLPExporterTakesTheTracesEndpointAsGiven(t *testing.T) {
	t.Parallel()
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	exportThroughSetup(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://127.0.0.1:1", // overridden
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/custom/path",
	})
	requests, resources := recv.received()
	require.Len(t, requests, 1)
	assert.Equal(t, "/custom/path", requests[0].URL.Path)
	assert.Empty(t, requests[0].Header.Get("Content-Encoding"))
	require.Len(t, resources, 1)
	assert.Len(t, resources[0].GetScopeSpans()[0].GetSpans(), 2)
}

// Not parallel: it sets OpenTelemetry's global error handler, where the
// batch span processor reports a failed export.
func TestOTLPExporterReportsWhatTheEndpointRefuses(t *testing.T) {
	var mu sync.Mutex
	var reported []error
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, err)
	}))
	t.Cleanup(func() { otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Print(err) })) })
	requests := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		requests++
		mu.Unlock()
		http.Error(w, "bad spans", http.StatusBadRequest)
	}))
	t.Cleanup(srv.Close)
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}
	tel, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "x", Getenv: func(k string) string { return env[k] }})
	require.NoError(t, err)
	_, span := tel.TracerProvider.Tracer("t").Start(context.Background(), "op")
	span.End()
	require.NoError(t, tel.Shutdown(context.Background()))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 1, requests, "a 400 is not retried")
	require.Len(t, reported, 1)
	assert.ErrorContains(t, reported[0], "400")
	assert.ErrorContains(t, reported[0], "bad spans")
}

func TestOTLPSettingsAreCheckedNamingTheVariable(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"endpoint not a URL": {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "jaeger:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		"traces endpoint scheme": {map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://jaeger/v1/traces"},
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		"header without =": {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318",
			"OTEL_EXPORTER_OTLP_HEADERS": "a=1,b"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		"header name": {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318",
			"OTEL_EXPORTER_OTLP_HEADERS": "x tenant=1"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		"timeout": {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318",
			"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"},
		"compression": {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4318",
			"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION"},
		"certificate file": {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://jaeger:4318",
			"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nonexistent/ca.pem"}, "OTEL_EXPORTER_OTLP_CERTIFICATE"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "x",
				Getenv: func(k string) string { return tc.env[k] }})
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}
