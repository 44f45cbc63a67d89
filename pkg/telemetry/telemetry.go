package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config is the telemetry section of every service's configuration.
type Config struct {
	// HTTPAddr serves /metrics, /healthz and /readyz. Empty disables the
	// server. Defaults differ per service (see config/).
	HTTPAddr string `koanf:"http_addr"`
	// LogLevel is debug, info, warn or error. Defaults to info.
	LogLevel string `koanf:"log_level"`
	// LogFormat is json or text. Defaults to json.
	LogFormat string `koanf:"log_format"`
}

// WithDefaults returns c with zero values replaced by defaults.
func (c Config) WithDefaults() Config {
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.LogFormat == "" {
		c.LogFormat = "json"
	}
	return c
}

// Validate checks the log settings; key names are relative to the section.
func (c Config) Validate(section string) error {
	var errs []error
	if _, err := ParseLevel(c.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("config key %s.log_level: %w", section, err))
	}
	switch c.LogFormat {
	case "", "json", "text":
	default:
		errs = append(errs, fmt.Errorf("config key %s.log_format: %q is not json or text", section, c.LogFormat))
	}
	return errors.Join(errs...)
}

// Options for Setup.
type Options struct {
	// ServiceName becomes the service.name resource attribute.
	ServiceName string
	// SpanExporter, when set, receives every span synchronously instead of
	// an OTLP exporter chosen from the environment. Tests pass an in-memory one.
	SpanExporter sdktrace.SpanExporter
	// Getenv reads the OTEL_* environment. Defaults to os.Getenv.
	Getenv func(string) string
}

// Telemetry holds a process's tracer and meter providers and the Prometheus
// registry its /metrics endpoint serves.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Registry       *prometheus.Registry

	shutdowns []func(context.Context) error
}

// Setup builds the providers. Without an OTLP endpoint in the environment,
// spans are still created (so trace ids reach logs and NATS headers) but not
// exported.
func Setup(ctx context.Context, opts Options) (*Telemetry, error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", opts.ServiceName)),
		resource.WithFromEnv(),
		resource.WithHost(),
		resource.WithProcessPID(),
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}

	t := &Telemetry{Registry: prometheus.NewRegistry()}
	t.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	switch {
	case opts.SpanExporter != nil:
		tpOpts = append(tpOpts, sdktrace.WithSyncer(opts.SpanExporter))
	case otlpConfigured(getenv):
		if err := checkOTLPProtocol(getenv); err != nil {
			return nil, err
		}
		exp, err := newOTLPExporter(getenv)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
		}
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)
	t.TracerProvider = tp
	t.shutdowns = append(t.shutdowns, tp.Shutdown)

	promExp, err := otelprom.New(otelprom.WithRegisterer(t.Registry), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	filter, err := exemplarFilter(getenv)
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(promExp), sdkmetric.WithResource(res), sdkmetric.WithExemplarFilter(filter))
	t.MeterProvider = mp
	t.shutdowns = append(t.shutdowns, mp.Shutdown)
	return t, nil
}

// exemplarFilter reads OTEL_METRICS_EXEMPLAR_FILTER. Unset, it turns
// exemplars off, unlike the SDK's default (trace_based): /metrics serves
// the Prometheus text format, which carries none, and offering every
// measurement made inside a span to a reservoir costs each job's metrics
// work for nothing.
func exemplarFilter(getenv func(string) string) (exemplar.Filter, error) {
	const key = "OTEL_METRICS_EXEMPLAR_FILTER"
	switch v := strings.ToLower(strings.TrimSpace(getenv(key))); v {
	case "", "always_off":
		return exemplar.AlwaysOffFilter, nil
	case "always_on":
		return exemplar.AlwaysOnFilter, nil
	case "trace_based":
		return exemplar.TraceBasedFilter, nil
	default:
		return nil, fmt.Errorf("telemetry: %s=%q: want always_off, always_on or trace_based", key, v)
	}
}

// Shutdown flushes and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, fn := range t.shutdowns {
		errs = append(errs, fn(ctx))
	}
	return errors.Join(errs...)
}

func otlpConfigured(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

func checkOTLPProtocol(getenv func(string) string) error {
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := getenv(name); v != "" {
			if v != "http/protobuf" {
				return fmt.Errorf("telemetry: %s=%q: jetfleet exports OTLP over http/protobuf only (port 4318)", name, v)
			}
			return nil
		}
	}
	return nil
}
