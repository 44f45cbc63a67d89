// Package webhook is the agent's built-in http handler: it POSTs each job's
// payload to a configured URL.
//
// The URL, the method (POST) and any extra headers come only from Config;
// a job contributes its payload, sent as the request body, and its
// metadata, sent in headers:
//
//	Jetfleet-Job-Id, Jetfleet-Queue, Jetfleet-Kind, Jetfleet-Attempt,
//	Jetfleet-Max-Attempts, Jetfleet-Deadline (RFC 3339, UTC),
//	Jetfleet-Schedule-Id and Jetfleet-Nominal-Time (jobs fired by the
//	scheduler), Jetfleet-Replayed-From, Idempotency-Key (the run's key,
//	agent.Job.IdempotencyKey: the same on every delivery and attempt of
//	the job's message), Jetfleet-Attempt-Key, and
//	traceparent/tracestate (the agent's execution span).
//
// The response decides the outcome:
//
//	2xx                  → success
//	408, 429, 5xx        → retryable; a Retry-After header (seconds or an
//	                       HTTP date) sets the delay, capped by max_retry_after
//	3xx (not followed)
//	and any other 4xx    → agent.NonRetryable: dead letter
//	no response          → retryable (connection refused, reset, timeout)
//
// The status line and the start of the response body (up to max_response
// bytes) go into the job's output tail, which events and dead letters carry.
//
// # Progress
//
// A slow endpoint reports progress with interim responses before its final
// one: a 1xx status (102 Processing) with a Jetfleet-Progress header of a
// fraction from 0 to 1 and an optional message,
//
//	HTTP/1.1 102 Processing
//	Jetfleet-Progress: 0.4 resizing image 4 of 10
//
// which the handler passes to agent.ReportProgress. Proxies between the
// agent and the endpoint may drop interim responses.
package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Config configures one http handler.
type Config struct {
	// URL receives a POST per job. Required; http or https.
	URL string `koanf:"url"`
	// Headers are sent with every request (for example Authorization).
	// They may not set Jetfleet-*, traceparent, tracestate,
	// Idempotency-Key, Content-Type or Content-Length.
	Headers map[string]string `koanf:"headers" secret:"true"`
	// ContentType of the request body. Defaults to application/json.
	ContentType string `koanf:"content_type"`
	// RequestTimeout bounds one request. Defaults to the attempt's timeout.
	RequestTimeout time.Duration `koanf:"request_timeout"`
	// MaxRetryAfter caps the delay a Retry-After header asks for. Defaults to 1h.
	MaxRetryAfter time.Duration `koanf:"max_retry_after"`
	// MaxResponse is how much of a response body is read into the job's
	// output. Defaults to 64KiB.
	MaxResponse config.ByteSize `koanf:"max_response"`
}

// Defaults of Config.
const (
	DefaultContentType   = "application/json"
	DefaultMaxRetryAfter = time.Hour
	DefaultMaxResponse   = 64 << 10
)

// WithDefaults returns c with zero values replaced by defaults.
func (c Config) WithDefaults() Config {
	if c.ContentType == "" {
		c.ContentType = DefaultContentType
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = DefaultMaxRetryAfter
	}
	if c.MaxResponse == 0 {
		c.MaxResponse = DefaultMaxResponse
	}
	return c
}

// Validate checks c; keys are reported below section (for example
// "handlers.notify").
func (c Config) Validate(section string) error {
	key := func(k string) string { return section + "." + k }
	var errs []error
	if c.URL == "" {
		errs = append(errs, config.Invalid(key("url"), "is required"))
	} else if u, err := url.Parse(c.URL); err != nil {
		errs = append(errs, config.Invalid(key("url"), "is not a URL: %v", err))
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, config.Invalid(key("url"), "must be an absolute http or https URL, got %q", u.Redacted()))
	}
	for name := range c.Headers {
		if err := checkHeaderName(name); err != nil {
			errs = append(errs, config.Invalid(key("headers"), "%v", err))
		}
	}
	if c.RequestTimeout < 0 {
		errs = append(errs, config.Invalid(key("request_timeout"), "must not be negative, got %s", c.RequestTimeout))
	}
	if c.MaxRetryAfter < 0 {
		errs = append(errs, config.Invalid(key("max_retry_after"), "must not be negative, got %s", c.MaxRetryAfter))
	}
	if c.MaxResponse < 0 {
		errs = append(errs, config.Invalid(key("max_response"), "must not be negative"))
	}
	return errors.Join(errs...)
}

func checkHeaderName(name string) error {
	if name == "" || strings.ContainsAny(name, " \t\r\n:") {
		return fmt.Errorf("%q is not a header name", name)
	}
	canonical := http.CanonicalHeaderKey(name)
	switch {
	case strings.HasPrefix(canonical, "Jetfleet-"):
		return fmt.Errorf("%s: Jetfleet-* headers carry the job's metadata", name)
	case canonical == "Traceparent", canonical == "Tracestate", canonical == "Idempotency-Key":
		return fmt.Errorf("%s is set from the job", name)
	case canonical == "Content-Type", canonical == "Content-Length", canonical == "Host":
		return fmt.Errorf("%s is set by the handler (see content_type)", name)
	}
	return nil
}

// Request headers with the job's metadata.
const (
	HeaderQueue          = "Jetfleet-Queue"
	HeaderKind           = "Jetfleet-Kind"
	HeaderAttempt        = "Jetfleet-Attempt"
	HeaderDeadline       = "Jetfleet-Deadline"
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderAttemptKey     = "Jetfleet-Attempt-Key"
)

// HeaderProgress, on an interim (1xx) response, reports the job's progress:
// "<fraction> <message>", such as "0.4 resizing image 4 of 10".
const HeaderProgress = "Jetfleet-Progress"

// Handler POSTs jobs to one URL. Use its Run method as the kind's
// agent.Handler, and Close it once the agent has stopped.
type Handler struct {
	cfg       Config
	url       *url.URL
	transport *http.Transport
	client    *http.Client
}

// New checks cfg and returns its handler.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate("http"); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	u, _ := url.Parse(cfg.URL)
	transport := http.DefaultTransport.(*http.Transport).Clone()
	return &Handler{cfg: cfg, url: u, transport: transport, client: &http.Client{
		Transport: transport,
		// A redirect is the server's choice of another URL: not followed.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// Close releases idle connections.
func (h *Handler) Close() { h.transport.CloseIdleConnections() }

// StatusError is a response that is not 2xx.
type StatusError struct {
	StatusCode int
	Status     string
}

func (e *StatusError) Error() string { return "http status " + e.Status }

// Run POSTs job to the configured URL.
func (h *Handler) Run(ctx context.Context, job *agent.Job) error {
	reqCtx := ctx
	if h.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		reqCtx, cancel = context.WithTimeoutCause(ctx, h.cfg.RequestTimeout,
			fmt.Errorf("request timed out after %s (request_timeout): %w", h.cfg.RequestTimeout, context.DeadlineExceeded))
		defer cancel()
	}
	// Interim responses (102 Processing) may report progress.
	reqCtx = httptrace.WithClientTrace(reqCtx, &httptrace.ClientTrace{
		Got1xxResponse: func(_ int, header textproto.MIMEHeader) error {
			reportProgress(ctx, job, header.Get(HeaderProgress))
			return nil
		},
	})
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, h.cfg.URL, bytes.NewReader(job.Payload))
	if err != nil {
		return fmt.Errorf("http: %w", err)
	}
	h.setHeaders(ctx, req, job)

	resp, err := h.client.Do(req)
	if err != nil {
		if ctx.Err() == nil && reqCtx.Err() != nil {
			return fmt.Errorf("http: POST %s: %w", h.url.Redacted(), context.Cause(reqCtx))
		}
		// The URL in err is the configured one: redact its password.
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("http: POST %s: %w", h.url.Redacted(), err)
	}
	defer func() { _ = resp.Body.Close() }() // read to its end or cut: nothing to report on close
	out := job.Output()
	fmt.Fprintf(out, "HTTP %s\n", resp.Status)
	n, _ := io.Copy(out, io.LimitReader(resp.Body, int64(h.cfg.MaxResponse)))
	if n == int64(h.cfg.MaxResponse) {
		if extra, _ := io.Copy(io.Discard, io.LimitReader(resp.Body, 1)); extra > 0 {
			fmt.Fprintf(out, "\n[jetfleet: response body cut after %d bytes (max_response)]\n", n)
		}
	}
	return h.outcome(resp, time.Now())
}

// reportProgress reports the progress an interim response's
// Jetfleet-Progress header says, if any; one that does not read is noted in
// the job's output.
func reportProgress(ctx context.Context, job *agent.Job, value string) {
	if value == "" {
		return
	}
	fraction, message, err := agent.ParseProgress(value)
	if err != nil {
		fmt.Fprintf(job.Output(), "[jetfleet: %s header ignored: %v]\n", HeaderProgress, err)
		return
	}
	_ = agent.ReportProgress(ctx, fraction, message) // +WPI failures are the agent's to log
}

func (h *Handler) setHeaders(ctx context.Context, req *http.Request, job *agent.Job) {
	for k, v := range h.cfg.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", h.cfg.ContentType)
	req.Header.Set("User-Agent", "jetfleet-agent ("+agent.Version+")")
	set := func(k, v string) { req.Header[k] = []string{v} }
	set(protocol.HeaderJobID, job.ID)
	set(HeaderIdempotencyKey, job.IdempotencyKey())
	set(HeaderAttemptKey, job.AttemptKey())
	set(HeaderQueue, job.Queue)
	set(HeaderKind, job.Kind)
	set(HeaderAttempt, strconv.Itoa(job.Attempt))
	set(protocol.HeaderMaxAttempts, strconv.Itoa(job.MaxAttempts))
	if !job.Deadline.IsZero() {
		set(HeaderDeadline, job.Deadline.UTC().Format(time.RFC3339Nano))
	}
	if job.ScheduleID != "" {
		set(protocol.HeaderScheduleID, job.ScheduleID)
	}
	if !job.NominalTime.IsZero() {
		set(protocol.HeaderNominalTime, job.NominalTime.UTC().Format(time.RFC3339Nano))
	}
	if job.ReplayedFrom != "" {
		set(protocol.HeaderReplayedFrom, job.ReplayedFrom)
	}
	trace := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, trace)
	// W3C trace context names its headers in lowercase.
	for k, v := range trace {
		req.Header[k] = []string{v}
	}
}

// outcome maps the response status; now is when it arrived.
func (h *Handler) outcome(resp *http.Response, now time.Time) error {
	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		return nil
	}
	err := fmt.Errorf("http: POST %s: %w", h.url.Redacted(), &StatusError{StatusCode: code, Status: resp.Status})
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500:
		if d, ok := retryAfter(resp.Header.Get("Retry-After"), now); ok {
			return agent.Retry(err, min(d, h.cfg.MaxRetryAfter))
		}
		return err
	case code >= 300 && code <= 399:
		return agent.NonRetryable(fmt.Errorf("%w: redirect to %q not followed", err, resp.Header.Get("Location")))
	}
	return agent.NonRetryable(err)
}

// retryAfter reads a Retry-After value: delay seconds or an HTTP date.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}
