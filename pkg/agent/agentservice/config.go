package agentservice

import (
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/agent/command"
	"github.com/jetfleet/jetfleet/pkg/agent/demo"
	"github.com/jetfleet/jetfleet/pkg/agent/webhook"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/service"
)

// ServiceConfig is the whole configuration of the agent service.
type ServiceConfig struct {
	service.Base `koanf:",squash"`
	Agent        agent.Config `koanf:"agent"`
	// Handlers run the jobs, one per job kind (the map's key).
	Handlers map[string]HandlerConfig `koanf:"handlers"`
}

// Handler types.
const (
	TypeExec = "exec"
	TypeHTTP = "http"
	// TypeDemo runs one of the demonstration kinds of package demo, for
	// trying a fleet without writing a handler.
	TypeDemo = "demo"
)

// HandlerConfig configures the handler of one job kind: its type, that
// type's settings (at the same level), and the kind's attempt policy.
type HandlerConfig struct {
	// Type is exec (run a program, see package command), http (POST to a
	// URL, see package webhook) or demo (package demo). Required.
	Type string `koanf:"type"`
	// Demo names the demo a handler of type demo runs: echo, sleep or
	// fail. Defaults to the kind.
	Demo string `koanf:"demo"`
	// Timeout bounds an attempt when the job sets none (Jetfleet-Timeout).
	// Defaults to agent.default_timeout.
	Timeout time.Duration `koanf:"timeout"`
	// MaxAttempts before the job is dead-lettered, unless the job sets its
	// own (Jetfleet-Max-Attempts). Defaults to agent.retry.max_attempts.
	MaxAttempts int `koanf:"max_attempts"`
	// Backoff between attempts; unset fields come from agent.retry.
	Backoff BackoffConfig `koanf:"backoff"`
	// Concurrency caps how many jobs of the kind run at once on this agent.
	// Defaults to 0: only agent.concurrency applies.
	Concurrency int `koanf:"concurrency"`
	// Exec holds the settings of type exec: command, args, dir, env,
	// inherit_env, kill_grace, retryable_exit_codes,
	// non_retryable_exit_codes, other_exit_codes, limits.
	Exec command.Config `koanf:",squash"`
	// HTTP holds the settings of type http: url, headers, content_type,
	// request_timeout, max_retry_after, max_response.
	HTTP webhook.Config `koanf:",squash"`
}

// BackoffConfig is the delay policy between attempts of a kind. Zero values
// inherit agent.retry's.
type BackoffConfig struct {
	// InitialDelay before the first retry.
	InitialDelay time.Duration `koanf:"initial_delay"`
	// Multiplier grows the delay per retry.
	Multiplier float64 `koanf:"multiplier"`
	// MaxDelay caps a delay.
	MaxDelay time.Duration `koanf:"max_delay"`
	// Jitter spreads each delay by ±this fraction; negative disables it.
	Jitter float64 `koanf:"jitter"`
}

// KindOptions are the SDK options of the handler's kind.
func (h HandlerConfig) KindOptions() agent.KindOptions {
	return agent.KindOptions{
		Timeout:     h.Timeout,
		Concurrency: h.Concurrency,
		Retry: agent.RetryPolicy{MaxAttempts: h.MaxAttempts, InitialDelay: h.Backoff.InitialDelay,
			Multiplier: h.Backoff.Multiplier, MaxDelay: h.Backoff.MaxDelay, Jitter: h.Backoff.Jitter},
	}
}

// DefaultHTTPAddr is where the agent service serves /metrics, /healthz and
// /readyz unless configured otherwise.
const DefaultHTTPAddr = "127.0.0.1:9101"

// DefaultServiceConfig returns the service's defaults. They have no
// handler: the configuration must name at least one.
func DefaultServiceConfig() *ServiceConfig {
	c := &ServiceConfig{}
	c.Telemetry.HTTPAddr = DefaultHTTPAddr
	return c
}

// ApplyDefaults implements service.Defaulter: every zero value becomes the
// default in force, a handler's inherited attempt policy included. The
// agent id stays empty when unset: the agent makes one when it starts.
func (c *ServiceConfig) ApplyDefaults() {
	c.Base.ApplyDefaults()
	id := c.Agent.ID
	c.Agent = c.Agent.WithDefaults()
	c.Agent.ID = id
	retry := c.Agent.Retry.Policy().WithDefaults()
	for kind, h := range c.Handlers {
		switch h.Type {
		case TypeExec:
			h.Exec = h.Exec.WithDefaults()
		case TypeHTTP:
			h.HTTP = h.HTTP.WithDefaults()
		}
		if h.Timeout == 0 {
			h.Timeout = c.Agent.DefaultTimeout
		}
		p := agent.RetryPolicy{MaxAttempts: h.MaxAttempts, InitialDelay: h.Backoff.InitialDelay, Multiplier: h.Backoff.Multiplier,
			MaxDelay: h.Backoff.MaxDelay, Jitter: h.Backoff.Jitter}
		if p.MaxAttempts == 0 {
			p.MaxAttempts = retry.MaxAttempts
		}
		if p.InitialDelay == 0 {
			p.InitialDelay = retry.InitialDelay
		}
		if p.Multiplier == 0 {
			p.Multiplier = retry.Multiplier
		}
		if p.MaxDelay == 0 {
			p.MaxDelay = retry.MaxDelay
		}
		if p.Jitter == 0 {
			p.Jitter = retry.Jitter
		}
		h.MaxAttempts = p.MaxAttempts
		h.Backoff = BackoffConfig{InitialDelay: p.InitialDelay, Multiplier: p.Multiplier, MaxDelay: p.MaxDelay, Jitter: p.Jitter}
		c.Handlers[kind] = h
	}
}

// Validate checks the shared sections, the agent section and every handler.
func (c *ServiceConfig) Validate() error {
	errs := []error{c.Base.Validate(), c.Agent.Validate("agent")}
	if len(c.Handlers) == 0 {
		errs = append(errs, config.Invalid("handlers", "configure at least one handler (a job kind and how to run it)"))
	}
	for _, kind := range slices.Sorted(maps.Keys(c.Handlers)) {
		section := "handlers." + kind
		if err := protocol.ValidateToken("kind", kind); err != nil {
			errs = append(errs, config.Invalid(section, "%v", err))
		}
		errs = append(errs, c.Handlers[kind].Validate(section))
	}
	return errors.Join(errs...)
}

// Validate checks one handler; keys are reported below section
// ("handlers.<kind>").
func (h HandlerConfig) Validate(section string) error {
	key := func(k string) string { return section + "." + k }
	var errs []error
	// Settings of the other type are a mistake: name each.
	foreign := func(typ string, v any) {
		for _, k := range setKeys(reflect.ValueOf(v), "") {
			errs = append(errs, config.Invalid(key(k), "is a setting of %s handlers; this handler's type is %s", typ, h.Type))
		}
	}
	foreignDemo := func() {
		if h.Demo != "" {
			errs = append(errs, config.Invalid(key("demo"), "is a setting of demo handlers; this handler's type is %s", h.Type))
		}
	}
	switch h.Type {
	case TypeExec:
		errs = append(errs, h.Exec.Validate(section))
		foreign(TypeHTTP, h.HTTP)
		foreignDemo()
	case TypeHTTP:
		errs = append(errs, h.HTTP.Validate(section))
		foreign(TypeExec, h.Exec)
		foreignDemo()
	case TypeDemo:
		if h.Demo != "" && !slices.Contains(demo.Names(), h.Demo) {
			errs = append(errs, config.Invalid(key("demo"), "unknown demo %q: use %s", h.Demo, strings.Join(demo.Names(), ", ")))
		}
		foreign(TypeExec, h.Exec)
		foreign(TypeHTTP, h.HTTP)
	case "":
		errs = append(errs, config.Invalid(key("type"), "is required: %s, %s or %s", TypeExec, TypeHTTP, TypeDemo))
	default:
		errs = append(errs, config.Invalid(key("type"), "unknown handler type %q: use %s, %s or %s", h.Type, TypeExec, TypeHTTP, TypeDemo))
	}
	if h.Timeout < 0 {
		errs = append(errs, config.Invalid(key("timeout"), "must not be negative, got %s", h.Timeout))
	}
	if h.MaxAttempts < 0 {
		errs = append(errs, config.Invalid(key("max_attempts"), "must not be negative, got %d", h.MaxAttempts))
	}
	if h.Concurrency < 0 {
		errs = append(errs, config.Invalid(key("concurrency"), "must not be negative, got %d", h.Concurrency))
	}
	if h.Backoff.MaxDelay < 0 {
		errs = append(errs, config.Invalid(key("backoff.max_delay"), "must not be negative, got %s", h.Backoff.MaxDelay))
	}
	errs = append(errs, agent.RetryConfig{InitialDelay: h.Backoff.InitialDelay, Multiplier: h.Backoff.Multiplier,
		Jitter: h.Backoff.Jitter}.Validate(key("backoff")))
	return errors.Join(errs...)
}

// setKeys lists the keys of the non-zero fields of struct v.
func setKeys(v reflect.Value, prefix string) []string {
	var out []string
	for i := range v.NumField() {
		f, fv := v.Type().Field(i), v.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("koanf"), ",")
		if name == "" || name == "-" || fv.IsZero() {
			continue
		}
		if fv.Kind() == reflect.Struct {
			out = append(out, setKeys(fv, prefix+name+".")...)
			continue
		}
		out = append(out, prefix+name)
	}
	return out
}
