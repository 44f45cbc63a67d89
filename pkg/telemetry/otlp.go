package telemetry

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// otlpExporter sends spans to an OTLP/HTTP endpoint as protobuf
// (http/protobuf, the protocol's port 4318). It is ours rather than
// otlptracehttp because that package's collector types bring in gRPC, and
// with it a tenth of the packages every jetfleet binary compiles, on the
// first run of `go tool task dev` too. It reads the OTLP exporter
// environment variables of the OpenTelemetry specification: endpoint,
// headers, timeout, compression and TLS files, each in its general and its
// traces-only form.
type otlpExporter struct {
	url      string
	headers  map[string]string
	gzip     bool
	timeout  time.Duration
	client   *http.Client
	shutdown atomic.Bool
}

// NewOTLPSpanExporter returns the exporter Setup uses, configured from the
// OTEL_EXPORTER_OTLP_* variables getenv reads, for a caller that builds its
// own tracer provider (a test exporting each span as it ends).
func NewOTLPSpanExporter(getenv func(string) string) (sdktrace.SpanExporter, error) {
	return newOTLPExporter(getenv)
}

// otlpDefaultTimeout is the specification's default for one export.
const otlpDefaultTimeout = 10 * time.Second

// newOTLPExporter builds the exporter from the environment; an error names
// the variable at fault.
func newOTLPExporter(getenv func(string) string) (*otlpExporter, error) {
	// lookup returns the traces-only variable when set, else the general one.
	lookup := func(suffix string) (name, value string) {
		for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_" + suffix, "OTEL_EXPORTER_OTLP_" + suffix} {
			if v := strings.TrimSpace(getenv(name)); v != "" {
				return name, v
			}
		}
		return "", ""
	}
	e := &otlpExporter{timeout: otlpDefaultTimeout, headers: map[string]string{}}

	// The traces endpoint is used as given; the general one is a base URL
	// that /v1/traces is appended to.
	if name, v := lookup("ENDPOINT"); name != "" {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%s=%q: want an http:// or https:// URL", name, v)
		}
		if name == "OTEL_EXPORTER_OTLP_ENDPOINT" {
			u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
		}
		e.url = u.String()
	} else {
		return nil, errors.New("neither OTEL_EXPORTER_OTLP_TRACES_ENDPOINT nor OTEL_EXPORTER_OTLP_ENDPOINT is set")
	}
	if name, v := lookup("HEADERS"); name != "" {
		for pair := range strings.SplitSeq(v, ",") {
			if strings.TrimSpace(pair) == "" {
				continue // "a=1," as some tools write it
			}
			key, value, ok := strings.Cut(pair, "=")
			key = strings.TrimSpace(key)
			if !ok || !validHeaderName(key) {
				return nil, fmt.Errorf("%s: %q is not key=value with a valid header name", name, pair)
			}
			decoded, err := url.PathUnescape(strings.TrimSpace(value))
			if err != nil {
				return nil, fmt.Errorf("%s: the value of %s: %w", name, key, err)
			}
			e.headers[key] = decoded
		}
	}
	if name, v := lookup("TIMEOUT"); name != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return nil, fmt.Errorf("%s=%q: want a positive number of milliseconds", name, v)
		}
		e.timeout = time.Duration(ms) * time.Millisecond
	}
	switch name, v := lookup("COMPRESSION"); v {
	case "", "none":
	case "gzip":
		e.gzip = true
	default:
		return nil, fmt.Errorf("%s=%q: want gzip or none", name, v)
	}
	tlsConfig, err := otlpTLS(lookup)
	if err != nil {
		return nil, err
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = tlsConfig
	e.client = &http.Client{Transport: transport}
	return e, nil
}

// validHeaderName reports whether key is an HTTP header name (RFC 9110
// token): a bad one would fail every export, not Setup.
func validHeaderName(key string) bool {
	if key == "" {
		return false
	}
	for _, c := range []byte(key) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// otlpTLS reads the CA and client certificate files; nil when none is set.
func otlpTLS(lookup func(string) (string, string)) (*tls.Config, error) {
	caName, caFile := lookup("CERTIFICATE")
	certName, certFile := lookup("CLIENT_CERTIFICATE")
	keyName, keyFile := lookup("CLIENT_KEY")
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", caName, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: %s holds no PEM certificate", caName, caFile)
		}
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY go together")
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s and %s: %w", certName, keyName, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// ExportSpans sends one batch, retrying what the specification calls
// retryable (429, 502, 503, 504, and failed connections) within the timeout.
func (e *otlpExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.shutdown.Load() || len(spans) == 0 {
		return nil
	}
	body, err := marshalExportRequest(spans)
	if err != nil {
		return fmt.Errorf("otlp: encode spans: %w", err)
	}
	if e.gzip {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(body) // writes to memory
		if err := zw.Close(); err != nil {
			return fmt.Errorf("otlp: gzip: %w", err)
		}
		body = buf.Bytes()
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	backoff := 100 * time.Millisecond
	for {
		retry, after, err := e.post(ctx, body)
		if err == nil || !retry {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("otlp: %w (last: %w)", ctx.Err(), err)
		case <-time.After(max(backoff, after)):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// post sends body once and says whether a failure is worth another try,
// and how long the endpoint asked to wait first (Retry-After).
func (e *otlpExporter) post(ctx context.Context, body []byte) (retry bool, after time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return false, 0, fmt.Errorf("otlp: %w", err)
	}
	for k, v := range e.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	if e.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		// A refused or reset connection, or a name that does not resolve
		// yet (a collector still starting), may pass; a certificate that
		// does not verify will not.
		var certInvalid *tls.CertificateVerificationError
		var unknownAuthority x509.UnknownAuthorityError
		var hostname x509.HostnameError
		permanent := errors.As(err, &certInvalid) || errors.As(err, &unknownAuthority) || errors.As(err, &hostname)
		return ctx.Err() == nil && !permanent, 0, fmt.Errorf("otlp: post %s: %w", e.url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024)) // for the error only
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return false, 0, nil
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusBadGateway,
		resp.StatusCode == http.StatusServiceUnavailable, resp.StatusCode == http.StatusGatewayTimeout:
		return true, retryAfter(resp.Header.Get("Retry-After")), fmt.Errorf("otlp: post %s: %s", e.url, resp.Status)
	default:
		return false, 0, fmt.Errorf("otlp: post %s: %s: %s", e.url, resp.Status, bytes.TrimSpace(msg))
	}
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil && secs > 0 {
		return time.Duration(secs) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(time.Until(at), 0)
	}
	return 0
}

// Shutdown makes later exports no-ops; batches in flight end on their own.
func (e *otlpExporter) Shutdown(context.Context) error {
	e.shutdown.Store(true)
	e.client.CloseIdleConnections()
	return nil
}

// marshalExportRequest encodes an ExportTraceServiceRequest: its one field
// (1, resource_spans) repeated, framed by hand so that the collector
// package, and gRPC with it, stays out of the build.
func marshalExportRequest(spans []sdktrace.ReadOnlySpan) ([]byte, error) {
	var out []byte
	for _, rs := range resourceSpans(spans) {
		b, err := proto.Marshal(rs)
		if err != nil {
			return nil, err
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, b)
	}
	return out, nil
}

// resourceSpans groups spans by resource, then by instrumentation scope, in
// the order they come.
func resourceSpans(spans []sdktrace.ReadOnlySpan) []*tracepb.ResourceSpans {
	type scopeKey struct {
		resource    attribute.Distinct
		name, ver   string
		schema      string
		scopeAttrID attribute.Distinct
	}
	var out []*tracepb.ResourceSpans
	byResource := map[attribute.Distinct]*tracepb.ResourceSpans{}
	byScope := map[scopeKey]*tracepb.ScopeSpans{}
	for _, s := range spans {
		res := s.Resource()
		resKey := res.Equivalent()
		rs, ok := byResource[resKey]
		if !ok {
			rs = &tracepb.ResourceSpans{
				Resource:  &resourcepb.Resource{Attributes: keyValues(res.Attributes())},
				SchemaUrl: res.SchemaURL(),
			}
			byResource[resKey] = rs
			out = append(out, rs)
		}
		scope := s.InstrumentationScope()
		key := scopeKey{resource: resKey, name: scope.Name, ver: scope.Version, schema: scope.SchemaURL,
			scopeAttrID: scope.Attributes.Equivalent()}
		ss, ok := byScope[key]
		if !ok {
			ss = &tracepb.ScopeSpans{
				Scope: &commonpb.InstrumentationScope{Name: scope.Name, Version: scope.Version,
					Attributes: keyValues(scope.Attributes.ToSlice())},
				SchemaUrl: scope.SchemaURL,
			}
			byScope[key] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, spanProto(s))
	}
	return out
}

func spanProto(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	p := &tracepb.Span{
		TraceId:                tid[:],
		SpanId:                 sid[:],
		TraceState:             sc.TraceState().String(),
		Flags:                  spanFlags(sc.TraceFlags(), s.Parent()),
		Name:                   s.Name(),
		Kind:                   spanKind(s.SpanKind()),
		StartTimeUnixNano:      unixNano(s.StartTime()),
		EndTimeUnixNano:        unixNano(s.EndTime()),
		Attributes:             keyValues(s.Attributes()),
		DroppedAttributesCount: uint32(max(s.DroppedAttributes(), 0)), //nolint:gosec // bounded below by 0
		DroppedEventsCount:     uint32(max(s.DroppedEvents(), 0)),     //nolint:gosec // bounded below by 0
		DroppedLinksCount:      uint32(max(s.DroppedLinks(), 0)),      //nolint:gosec // bounded below by 0
		Status:                 spanStatus(s.Status()),
	}
	if parent := s.Parent(); parent.HasSpanID() {
		psid := parent.SpanID()
		p.ParentSpanId = psid[:]
	}
	for _, ev := range s.Events() {
		p.Events = append(p.Events, &tracepb.Span_Event{
			TimeUnixNano:           unixNano(ev.Time),
			Name:                   ev.Name,
			Attributes:             keyValues(ev.Attributes),
			DroppedAttributesCount: uint32(max(ev.DroppedAttributeCount, 0)), //nolint:gosec // bounded below by 0
		})
	}
	for _, l := range s.Links() {
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		p.Links = append(p.Links, &tracepb.Span_Link{
			TraceId:                ltid[:],
			SpanId:                 lsid[:],
			TraceState:             l.SpanContext.TraceState().String(),
			Attributes:             keyValues(l.Attributes),
			DroppedAttributesCount: uint32(max(l.DroppedAttributeCount, 0)), //nolint:gosec // bounded below by 0
			Flags:                  spanFlags(l.SpanContext.TraceFlags(), l.SpanContext),
		})
	}
	return p
}

// spanFlags carries the W3C trace flags and whether the parent (or the
// linked span) is remote, as the proto's SpanFlags bits say.
func spanFlags(flags trace.TraceFlags, parent trace.SpanContext) uint32 {
	out := uint32(flags) | uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK)
	if parent.IsRemote() {
		out |= uint32(tracepb.SpanFlags_SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)
	}
	return out
}

func spanKind(k trace.SpanKind) tracepb.Span_SpanKind {
	switch k {
	case trace.SpanKindInternal:
		return tracepb.Span_SPAN_KIND_INTERNAL
	case trace.SpanKindServer:
		return tracepb.Span_SPAN_KIND_SERVER
	case trace.SpanKindClient:
		return tracepb.Span_SPAN_KIND_CLIENT
	case trace.SpanKindProducer:
		return tracepb.Span_SPAN_KIND_PRODUCER
	case trace.SpanKindConsumer:
		return tracepb.Span_SPAN_KIND_CONSUMER
	default:
		return tracepb.Span_SPAN_KIND_UNSPECIFIED
	}
}

// spanStatus maps the SDK's codes, whose numbers differ from the proto's.
func spanStatus(st sdktrace.Status) *tracepb.Status {
	switch st.Code {
	case codes.Error:
		return &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: st.Description}
	case codes.Ok:
		return &tracepb.Status{Code: tracepb.Status_STATUS_CODE_OK}
	default:
		return &tracepb.Status{Code: tracepb.Status_STATUS_CODE_UNSET}
	}
}

func unixNano(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(max(t.UnixNano(), 0)) //nolint:gosec // bounded below by 0
}

func keyValues(attrs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	out := make([]*commonpb.KeyValue, 0, len(attrs))
	for _, kv := range attrs {
		out = append(out, &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.BYTESLICE:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{BytesValue: v.AsByteSlice()}}
	case attribute.BOOLSLICE:
		return arrayValue(v.AsBoolSlice(), attribute.BoolValue)
	case attribute.INT64SLICE:
		return arrayValue(v.AsInt64Slice(), attribute.Int64Value)
	case attribute.FLOAT64SLICE:
		return arrayValue(v.AsFloat64Slice(), attribute.Float64Value)
	case attribute.STRINGSLICE:
		return arrayValue(v.AsStringSlice(), attribute.StringValue)
	case attribute.SLICE:
		return arrayValue(v.AsSlice(), func(x attribute.Value) attribute.Value { return x })
	case attribute.MAP:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_KvlistValue{
			KvlistValue: &commonpb.KeyValueList{Values: keyValues(v.AsMap())}}}
	default: // EMPTY
		return &commonpb.AnyValue{}
	}
}

func arrayValue[T any](items []T, value func(T) attribute.Value) *commonpb.AnyValue {
	arr := &commonpb.ArrayValue{Values: make([]*commonpb.AnyValue, 0, len(items))}
	for _, it := range items {
		arr.Values = append(arr.Values, anyValue(value(it)))
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}
}
