package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/lease"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Config is the supervisor section of the configuration (koanf
// "supervisor"). Zero values mean the documented default.
type Config struct {
	// LeaseKey (default "supervisor"), RenewInterval and AcquireInterval:
	// the leader lease.
	lease.Settings `koanf:",squash"`

	// MissedHeartbeats is how many heartbeat intervals (each agent's own)
	// may pass without a heartbeat before the agent is probed and, when it
	// does not answer, declared dead. Defaults to 3.
	MissedHeartbeats int `koanf:"missed_heartbeats"`
	// CheckInterval is how often liveness and deadlines are checked.
	// Defaults to 250ms.
	CheckInterval time.Duration `koanf:"check_interval"`
	// ProbeTimeout bounds the ping sent to a silent agent before it is
	// declared dead. Defaults to 500ms.
	ProbeTimeout time.Duration `koanf:"probe_timeout"`
	// DeadAgentRetention is how long a dead agent stays listed. Defaults to 10m.
	DeadAgentRetention time.Duration `koanf:"dead_agent_retention"`

	// DeadlineGrace is how long an attempt may run past its timeout (the
	// deadline in its agent's heartbeat, measured as a duration on the
	// supervisor's clock) before the supervisor tells the agent to time it
	// out. Defaults to 30s.
	DeadlineGrace time.Duration `koanf:"deadline_grace"`
	// KillGrace is how long an agent has to end an attempt after the
	// timeout command; then the supervisor fails the attempt itself (the
	// kind's escalation timeout_action) and records timed_out. Defaults to 30s.
	KillGrace time.Duration `koanf:"kill_grace"`

	// ReconcileInterval is how often the leader looks for jobs past their
	// consumer's max_deliver that no advisory covered (and once when it
	// becomes leader). Defaults to 1m.
	ReconcileInterval time.Duration `koanf:"reconcile_interval"`
	// UnroutableAfter is how long a job on a subject no queue consumer
	// serves (a queue without a consumer, a subject not of the form
	// jobs.<queue>.<kind>) stays in JOBS before the leader dead-letters it
	// with reason unroutable or invalid_subject: time for its queue to
	// appear (an agent starting). Defaults to 5s.
	UnroutableAfter time.Duration `koanf:"unroutable_after"`
	// RequestTimeout bounds each JetStream request, API call and command.
	// Defaults to 10s.
	RequestTimeout time.Duration `koanf:"request_timeout"`

	// HistorySize is how many executions are kept per job kind and per
	// schedule. Defaults to 100.
	HistorySize int `koanf:"history_size"`
	// HistoryMaxAge keeps execution history, replay markers and alert
	// incidents this long. Defaults to 720h (30 days).
	HistoryMaxAge time.Duration `koanf:"history_max_age"`

	// Alerts configures where alerts go and how they are deduplicated.
	Alerts AlertsConfig `koanf:"alerts"`
	// Escalation says what happens when jobs fail for good, per kind and
	// per schedule.
	Escalation EscalationConfig `koanf:"escalation"`
	// Breaker configures the circuit breaker of each queue.
	Breaker BreakerConfig `koanf:"breaker"`
	// Thresholds raise alerts on fleet-wide measures.
	Thresholds ThresholdsConfig `koanf:"thresholds"`
	// Trends configures the rollups per kind and schedule and the
	// degrading verdict (trends.go).
	Trends TrendsConfig `koanf:"trends"`
}

// AlertsConfig configures alert delivery.
type AlertsConfig struct {
	// DedupeWindow makes alerts with the same incident key inside it one
	// alert. Defaults to 10m.
	DedupeWindow time.Duration `koanf:"dedupe_window"`
	// Webhooks receive every alert at or above their severity as an HTTP
	// POST of the Alert document (JSON), by name.
	Webhooks map[string]WebhookConfig `koanf:"webhooks"`
	// AgentDead is the severity of the alert raised when an agent is
	// declared dead: info, warning, critical or none. Defaults to warning.
	AgentDead string `koanf:"agent_dead"`
}

// WebhookConfig is one HTTP endpoint for alerts.
type WebhookConfig struct {
	// URL receives POST requests with a JSON Alert body.
	URL string `koanf:"url" secret:"true"`
	// Headers are added to each request (for example Authorization).
	Headers map[string]string `koanf:"headers" secret:"true"`
	// MinSeverity is the lowest severity sent: info, warning or critical.
	// Defaults to warning.
	MinSeverity string `koanf:"min_severity"`
	// Timeout bounds one request. Defaults to 5s.
	Timeout time.Duration `koanf:"timeout"`
	// MaxAttempts bounds deliveries of one alert; a request fails on a
	// network error or a status outside 2xx. Defaults to 5.
	MaxAttempts int `koanf:"max_attempts"`
	// Backoff is the wait before the second attempt; it doubles after each
	// failure, up to 1m. Defaults to 1s.
	Backoff time.Duration `koanf:"backoff"`
}

// EscalationConfig holds the escalation policies. A job's policy is its
// schedule's, over its kind's, over the default, field by field.
type EscalationConfig struct {
	Default   EscalationPolicy            `koanf:"default"`
	Kinds     map[string]EscalationPolicy `koanf:"kinds"`
	Schedules map[string]EscalationPolicy `koanf:"schedules"`
}

// EscalationPolicy says what happens after a final failure (a dead letter).
// Zero fields inherit.
type EscalationPolicy struct {
	// Alert is the severity of the alert on a final failure: info, warning,
	// critical, or none. Defaults to critical.
	Alert string `koanf:"alert"`
	// CompensateKind, when set, publishes a job of this kind with the failed
	// job's payload and headers (plus Jetfleet-Compensates and
	// Jetfleet-Dead-Letter) on every final failure.
	CompensateKind string `koanf:"compensate_kind"`
	// CompensateQueue is the queue of the compensating job. Defaults to the
	// failed job's queue.
	CompensateQueue string `koanf:"compensate_queue"`
	// PauseScheduleAfter pauses a schedule after this many of its runs in a
	// row ended dead (and again after as many more). 0 never pauses.
	PauseScheduleAfter int `koanf:"pause_schedule_after"`
	// TimeoutAction is what the supervisor does with an attempt still
	// running kill_grace after the timeout command: nak (redeliver; the attempt
	// counts) or dead_letter (reason timed_out). Defaults to nak.
	TimeoutAction string `koanf:"timeout_action"`
}

// Timeout actions.
const (
	TimeoutActionNak        = "nak"
	TimeoutActionDeadLetter = "dead_letter"
)

// SeverityNone disables an alert.
const SeverityNone = "none"

// BreakerConfig configures the circuit breakers: the default and per queue.
type BreakerConfig struct {
	Default BreakerPolicy            `koanf:"default"`
	Queues  map[string]BreakerPolicy `koanf:"queues"`
}

// BreakerPolicy is the circuit breaker of one queue: when the share of
// failed attempts over Window reaches FailureRate (with at least MinSamples
// settled attempts), the queue's consumer is paused for CoolDown. Zero
// fields inherit from the default.
type BreakerPolicy struct {
	// FailureRate in (0, 1] opens the breaker; 0 disables it (the default).
	FailureRate float64 `koanf:"failure_rate"`
	// Window over which attempts are counted. Defaults to 1m.
	Window time.Duration `koanf:"window"`
	// MinSamples is the fewest settled attempts in the window that can open
	// the breaker. Defaults to 20.
	MinSamples int `koanf:"min_samples"`
	// CoolDown is how long the queue stays paused. Defaults to 1m.
	CoolDown time.Duration `koanf:"cool_down"`
}

// ThresholdsConfig raises warning alerts when fleet measures cross limits.
// A zero limit disables its alert.
type ThresholdsConfig struct {
	// FailureRate alerts when a queue's share of failed attempts over
	// FailureWindow reaches it (with at least MinSamples attempts).
	FailureRate float64 `koanf:"failure_rate"`
	// FailureWindow defaults to 5m.
	FailureWindow time.Duration `koanf:"failure_window"`
	// MinSamples defaults to 20.
	MinSamples int `koanf:"min_samples"`
	// SchedulingDelay alerts when a schedule fires this much later than its
	// nominal time.
	SchedulingDelay time.Duration `koanf:"scheduling_delay"`
	// DLQDepth alerts when the DLQ stream holds more dead letters.
	DLQDepth int64 `koanf:"dlq_depth"`
	// DLQDepthInterval is how often the DLQ depth is measured. Defaults to 15s.
	DLQDepthInterval time.Duration `koanf:"dlq_depth_interval"`
}

// Defaults of Config.
const (
	DefaultLeaseKey           = "supervisor"
	DefaultMissedHeartbeats   = 3
	DefaultCheckInterval      = 250 * time.Millisecond
	DefaultProbeTimeout       = 500 * time.Millisecond
	DefaultDeadAgentRetention = 10 * time.Minute
	DefaultDeadlineGrace      = 30 * time.Second
	DefaultKillGrace          = 30 * time.Second
	DefaultReconcileInterval  = time.Minute
	DefaultUnroutableAfter    = 5 * time.Second
	DefaultRequestTimeout     = 10 * time.Second
	DefaultHistorySize        = 100
	DefaultHistoryMaxAge      = 30 * 24 * time.Hour
	DefaultDedupeWindow       = 10 * time.Minute
	DefaultWebhookTimeout     = 5 * time.Second
	DefaultWebhookAttempts    = 5
	DefaultWebhookBackoff     = time.Second
	DefaultBreakerWindow      = time.Minute
	DefaultBreakerMinSamples  = 20
	DefaultBreakerCoolDown    = time.Minute
	DefaultFailureWindow      = 5 * time.Minute
	DefaultThresholdSamples   = 20
	DefaultDLQDepthInterval   = 15 * time.Second
)

// withDefaults fills zero values; leaseTTL is topology.lease_ttl.
func (c Config) withDefaults(leaseTTL time.Duration) Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	c.Settings = c.Settings.WithDefaults(DefaultLeaseKey, leaseTTL)
	if c.MissedHeartbeats == 0 {
		c.MissedHeartbeats = DefaultMissedHeartbeats
	}
	def(&c.CheckInterval, DefaultCheckInterval)
	def(&c.ProbeTimeout, DefaultProbeTimeout)
	def(&c.DeadAgentRetention, DefaultDeadAgentRetention)
	def(&c.DeadlineGrace, DefaultDeadlineGrace)
	def(&c.KillGrace, DefaultKillGrace)
	def(&c.ReconcileInterval, DefaultReconcileInterval)
	def(&c.UnroutableAfter, DefaultUnroutableAfter)
	def(&c.RequestTimeout, DefaultRequestTimeout)
	if c.HistorySize == 0 {
		c.HistorySize = DefaultHistorySize
	}
	def(&c.HistoryMaxAge, DefaultHistoryMaxAge)
	def(&c.Alerts.DedupeWindow, DefaultDedupeWindow)
	if c.Alerts.AgentDead == "" {
		c.Alerts.AgentDead = protocol.SeverityWarning
	}
	hooks := make(map[string]WebhookConfig, len(c.Alerts.Webhooks))
	for name, w := range c.Alerts.Webhooks {
		if w.MinSeverity == "" {
			w.MinSeverity = protocol.SeverityWarning
		}
		def(&w.Timeout, DefaultWebhookTimeout)
		if w.MaxAttempts == 0 {
			w.MaxAttempts = DefaultWebhookAttempts
		}
		def(&w.Backoff, DefaultWebhookBackoff)
		hooks[name] = w
	}
	c.Alerts.Webhooks = hooks
	if c.Escalation.Default.Alert == "" {
		c.Escalation.Default.Alert = protocol.SeverityCritical
	}
	if c.Escalation.Default.TimeoutAction == "" {
		c.Escalation.Default.TimeoutAction = TimeoutActionNak
	}
	def(&c.Breaker.Default.Window, DefaultBreakerWindow)
	if c.Breaker.Default.MinSamples == 0 {
		c.Breaker.Default.MinSamples = DefaultBreakerMinSamples
	}
	def(&c.Breaker.Default.CoolDown, DefaultBreakerCoolDown)
	def(&c.Thresholds.FailureWindow, DefaultFailureWindow)
	if c.Thresholds.MinSamples == 0 {
		c.Thresholds.MinSamples = DefaultThresholdSamples
	}
	def(&c.Thresholds.DLQDepthInterval, DefaultDLQDepthInterval)
	c.Trends = c.Trends.withDefaults()
	return c
}

// Validate checks c against the lease TTL; keys are reported below section.
func (c Config) Validate(section string, leaseTTL time.Duration) error {
	key := func(k string) string { return section + "." + k }
	errs := c.Settings.Validate(key, leaseTTL)
	for k, d := range map[string]time.Duration{
		"check_interval": c.CheckInterval,
		"probe_timeout":  c.ProbeTimeout, "dead_agent_retention": c.DeadAgentRetention, "deadline_grace": c.DeadlineGrace,
		"kill_grace": c.KillGrace, "reconcile_interval": c.ReconcileInterval, "request_timeout": c.RequestTimeout,
		"unroutable_after": c.UnroutableAfter,
		"history_max_age":  c.HistoryMaxAge, "alerts.dedupe_window": c.Alerts.DedupeWindow,
		"thresholds.failure_window": c.Thresholds.FailureWindow, "thresholds.scheduling_delay": c.Thresholds.SchedulingDelay,
		"thresholds.dlq_depth_interval": c.Thresholds.DLQDepthInterval,
	} {
		if d < 0 {
			errs = append(errs, config.Invalid(key(k), "must not be negative, got %s", d))
		}
	}
	if c.MissedHeartbeats < 0 || c.MissedHeartbeats == 1 {
		errs = append(errs, config.Invalid(key("missed_heartbeats"), "must be at least 2, got %d", c.MissedHeartbeats))
	}
	if c.CheckInterval != 0 && c.CheckInterval < 10*time.Millisecond {
		errs = append(errs, config.Invalid(key("check_interval"), "must be at least 10ms, got %s", c.CheckInterval))
	}
	if c.HistorySize < 0 || c.HistorySize > 10_000 {
		errs = append(errs, config.Invalid(key("history_size"), "must be 0 (default %d) to 10000", DefaultHistorySize))
	}
	if err := validSeverity(c.Alerts.AgentDead, true); err != nil {
		errs = append(errs, config.Invalid(key("alerts.agent_dead"), "%v", err))
	}
	for name, w := range c.Alerts.Webhooks {
		wkey := func(k string) string { return key("alerts.webhooks." + name + "." + k) }
		if u, err := url.Parse(w.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, config.Invalid(wkey("url"), "must be an http or https URL"))
		}
		if err := validSeverity(w.MinSeverity, false); err != nil {
			errs = append(errs, config.Invalid(wkey("min_severity"), "%v", err))
		}
		if w.Timeout < 0 || w.Backoff < 0 {
			errs = append(errs, config.Invalid(wkey("timeout"), "durations must not be negative"))
		}
		if w.MaxAttempts < 0 {
			errs = append(errs, config.Invalid(wkey("max_attempts"), "must not be negative"))
		}
	}
	errs = append(errs, c.Escalation.Default.validate(key("escalation.default")))
	for kind, p := range c.Escalation.Kinds {
		if err := protocol.ValidateToken("kind", kind); err != nil {
			errs = append(errs, config.Invalid(key("escalation.kinds."+kind), "%v", err))
		}
		errs = append(errs, p.validate(key("escalation.kinds."+kind)))
	}
	for id, p := range c.Escalation.Schedules {
		if err := protocol.ValidateToken("schedule id", id); err != nil {
			errs = append(errs, config.Invalid(key("escalation.schedules."+id), "%v", err))
		}
		errs = append(errs, p.validate(key("escalation.schedules."+id)))
	}
	errs = append(errs, c.Breaker.Default.validate(key("breaker.default")))
	for q, p := range c.Breaker.Queues {
		if err := protocol.ValidateToken("queue", q); err != nil {
			errs = append(errs, config.Invalid(key("breaker.queues."+q), "%v", err))
		}
		errs = append(errs, p.validate(key("breaker.queues."+q)))
	}
	if c.Thresholds.FailureRate < 0 || c.Thresholds.FailureRate > 1 {
		errs = append(errs, config.Invalid(key("thresholds.failure_rate"), "must be 0 (off) to 1, got %g", c.Thresholds.FailureRate))
	}
	if c.Thresholds.MinSamples < 0 || c.Thresholds.DLQDepth < 0 {
		errs = append(errs, config.Invalid(key("thresholds.min_samples"), "counts must not be negative"))
	}
	errs = append(errs, c.Trends.validate(key("trends")))
	return errors.Join(errs...)
}

func (p EscalationPolicy) validate(section string) error {
	var errs []error
	if err := validSeverity(p.Alert, true); err != nil {
		errs = append(errs, config.Invalid(section+".alert", "%v", err))
	}
	if p.CompensateKind != "" {
		if err := protocol.ValidateToken("kind", p.CompensateKind); err != nil {
			errs = append(errs, config.Invalid(section+".compensate_kind", "%v", err))
		}
	}
	if p.CompensateQueue != "" {
		if err := protocol.ValidateToken("queue", p.CompensateQueue); err != nil {
			errs = append(errs, config.Invalid(section+".compensate_queue", "%v", err))
		}
	}
	if p.PauseScheduleAfter < 0 {
		errs = append(errs, config.Invalid(section+".pause_schedule_after", "must not be negative"))
	}
	switch p.TimeoutAction {
	case "", TimeoutActionNak, TimeoutActionDeadLetter:
	default:
		errs = append(errs, config.Invalid(section+".timeout_action", "must be nak or dead_letter, got %q", p.TimeoutAction))
	}
	return errors.Join(errs...)
}

func (p BreakerPolicy) validate(section string) error {
	var errs []error
	if p.FailureRate < 0 || p.FailureRate > 1 {
		errs = append(errs, config.Invalid(section+".failure_rate", "must be 0 (off) to 1, got %g", p.FailureRate))
	}
	if p.Window < 0 || p.CoolDown < 0 {
		errs = append(errs, config.Invalid(section+".window", "durations must not be negative"))
	}
	if p.MinSamples < 0 {
		errs = append(errs, config.Invalid(section+".min_samples", "must not be negative"))
	}
	return errors.Join(errs...)
}

func validSeverity(s string, noneAllowed bool) error {
	switch s {
	case "", protocol.SeverityInfo, protocol.SeverityWarning, protocol.SeverityCritical:
		return nil
	case SeverityNone:
		if noneAllowed {
			return nil
		}
	}
	if noneAllowed {
		return fmt.Errorf("%q is not info, warning, critical or none", s)
	}
	return fmt.Errorf("%q is not info, warning or critical", s)
}

// severityRank orders severities; unknown ones rank below info.
func severityRank(s string) int {
	switch s {
	case protocol.SeverityInfo:
		return 1
	case protocol.SeverityWarning:
		return 2
	case protocol.SeverityCritical:
		return 3
	}
	return 0
}

// policyFor resolves the escalation policy of a job of kind fired by
// scheduleID (may be empty): schedule over kind over default, field by field.
func (c Config) policyFor(kind, scheduleID string) EscalationPolicy {
	p := c.Escalation.Default
	over := func(o EscalationPolicy) {
		if o.Alert != "" {
			p.Alert = o.Alert
		}
		if o.CompensateKind != "" {
			p.CompensateKind = o.CompensateKind
		}
		if o.CompensateQueue != "" {
			p.CompensateQueue = o.CompensateQueue
		}
		if o.PauseScheduleAfter != 0 {
			p.PauseScheduleAfter = o.PauseScheduleAfter
		}
		if o.TimeoutAction != "" {
			p.TimeoutAction = o.TimeoutAction
		}
	}
	if o, ok := c.Escalation.Kinds[kind]; ok {
		over(o)
	}
	if scheduleID != "" {
		if o, ok := c.Escalation.Schedules[scheduleID]; ok {
			over(o)
		}
	}
	return p
}

// breakerFor resolves the breaker policy of queue.
func (c Config) breakerFor(queue string) BreakerPolicy {
	p := c.Breaker.Default
	if o, ok := c.Breaker.Queues[queue]; ok {
		if o.FailureRate != 0 {
			p.FailureRate = o.FailureRate
		}
		if o.Window != 0 {
			p.Window = o.Window
		}
		if o.MinSamples != 0 {
			p.MinSamples = o.MinSamples
		}
		if o.CoolDown != 0 {
			p.CoolDown = o.CoolDown
		}
	}
	return p
}

// ServiceConfig is the whole configuration of the supervisor service.
type ServiceConfig struct {
	service.Base `koanf:",squash"`
	Supervisor   Config `koanf:"supervisor"`
}

// DefaultHTTPAddr is where the supervisor service serves /metrics, /healthz
// and /readyz unless configured otherwise.
const DefaultHTTPAddr = "127.0.0.1:9103"

// DefaultServiceConfig returns the service's defaults.
func DefaultServiceConfig() *ServiceConfig {
	c := &ServiceConfig{}
	c.Telemetry.HTTPAddr = DefaultHTTPAddr
	return c
}

// WithDefaults returns c with zero values replaced by their defaults;
// leaseTTL is topology.lease_ttl.
func (c Config) WithDefaults(leaseTTL time.Duration) Config { return c.withDefaults(leaseTTL) }

// ApplyDefaults implements service.Defaulter.
func (c *ServiceConfig) ApplyDefaults() {
	c.Base.ApplyDefaults()
	c.Supervisor = c.Supervisor.WithDefaults(c.Topology.LeaseTTL)
}

// Validate checks the shared sections and the supervisor section.
func (c *ServiceConfig) Validate() error {
	ttl := c.Topology.WithDefaults().LeaseTTL
	return errors.Join(c.Base.Validate(), c.Supervisor.Validate("supervisor", ttl))
}

// BuildFunc returns the service.BuildFunc of the supervisor service: it
// builds a Supervisor on the real clock and registers its readiness check.
func BuildFunc(cfg Config) service.BuildFunc {
	return func(_ context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		s, err := New(cfg, env, clock.Real())
		if err != nil {
			return nil, err
		}
		if http != nil {
			http.AddReadyCheck("supervisor", s.Ready)
		}
		return s, nil
	}
}
