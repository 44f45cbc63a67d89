// Package telemetry sets up what every jetfleet service reports: OpenTelemetry
// traces (exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, kept in process otherwise),
// OpenTelemetry metrics served in the Prometheus format on /metrics, /healthz
// and /readyz endpoints, JSON logs that carry trace_id and span_id, and W3C
// trace-context propagation through NATS headers with lowercase keys.
package telemetry
