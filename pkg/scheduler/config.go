package scheduler

import (
	"context"
	"errors"
	"time"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/lease"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Config is the scheduler section of the configuration (koanf "scheduler").
// Zero values mean the documented default.
type Config struct {
	// LeaseKey (default "scheduler"), RenewInterval and AcquireInterval:
	// the leader lease.
	lease.Settings `koanf:",squash"`
	// MisfireThreshold is how late a fire may be and still count as on time;
	// later ones (after downtime) follow the schedule's misfire policy. Keep
	// it above topology.lease_ttl so that a failover misfires nothing.
	// Defaults to 10s.
	MisfireThreshold time.Duration `koanf:"misfire_threshold"`
	// PublishTimeout bounds the wait for JetStream to acknowledge a batch of
	// fires. Defaults to 10s.
	PublishTimeout time.Duration `koanf:"publish_timeout"`
	// ResendAfter is how long a batch waits with no answer at all before it
	// sends its unanswered messages again (each is stored at most once): a
	// stream electing a new leader drops what is sent to it meanwhile.
	// Defaults to 2s; at or above publish_timeout nothing is sent again.
	ResendAfter time.Duration `koanf:"resend_after"`
	// RetryDelay is the wait before a schedule whose fire could not be
	// published is tried again. Defaults to 1s.
	RetryDelay time.Duration `koanf:"retry_delay"`
	// MaxBackfill bounds the fires of one backfill request. Defaults to 1000.
	MaxBackfill int `koanf:"max_backfill"`
	// LostRunGrace is how long the leader waits for an event that ends a
	// run (succeeded, skipped_duplicate, dead) once the run's job has left
	// JOBS; past it the run counts as over (skipped, reason run_lost), so
	// that a lost event cannot block an overlap policy for good. The leader
	// checks the running runs every LostRunGrace/2. Defaults to 1m.
	LostRunGrace time.Duration `koanf:"lost_run_grace"`
	// TestClockOffset moves this replica's scheduling clock by a fixed
	// amount (e.g. 30s ahead, -30s behind). It exists only for the cluster
	// fault run's clock-skew scenario (e2e/chaos, docs/reliability.md):
	// never set it in production. The leader lease keeps the real clock; its
	// TTL is measured by the server. Defaults to 0; at most ±1h.
	TestClockOffset time.Duration `koanf:"test_clock_offset"`
}

// Defaults of Config.
const (
	DefaultLeaseKey         = "scheduler"
	DefaultMisfireThreshold = 10 * time.Second
	DefaultPublishTimeout   = 10 * time.Second
	DefaultResendAfter      = 2 * time.Second
	DefaultRetryDelay       = time.Second
	DefaultMaxBackfill      = 1000
	DefaultLostRunGrace     = time.Minute
)

// WithDefaults returns c with zero values replaced by their defaults;
// leaseTTL is topology.lease_ttl.
func (c Config) WithDefaults(leaseTTL time.Duration) Config { return c.withDefaults(leaseTTL) }

// ApplyDefaults implements service.Defaulter.
func (c *ServiceConfig) ApplyDefaults() {
	c.Base.ApplyDefaults()
	c.Scheduler = c.Scheduler.WithDefaults(c.Topology.LeaseTTL)
}

// withDefaults fills zero values; leaseTTL is topology.lease_ttl.
func (c Config) withDefaults(leaseTTL time.Duration) Config {
	c.Settings = c.Settings.WithDefaults(DefaultLeaseKey, leaseTTL)
	if c.MisfireThreshold == 0 {
		c.MisfireThreshold = DefaultMisfireThreshold
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.ResendAfter == 0 {
		c.ResendAfter = DefaultResendAfter
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.MaxBackfill == 0 {
		c.MaxBackfill = DefaultMaxBackfill
	}
	if c.LostRunGrace == 0 {
		c.LostRunGrace = DefaultLostRunGrace
	}
	return c
}

// Validate checks c against the lease TTL; keys are reported below section.
func (c Config) Validate(section string, leaseTTL time.Duration) error {
	key := func(k string) string { return section + "." + k }
	errs := c.Settings.Validate(key, leaseTTL)
	for k, d := range map[string]time.Duration{
		"misfire_threshold": c.MisfireThreshold,
		"publish_timeout":   c.PublishTimeout, "resend_after": c.ResendAfter, "retry_delay": c.RetryDelay, "lost_run_grace": c.LostRunGrace,
	} {
		if d < 0 {
			errs = append(errs, config.Invalid(key(k), "must not be negative, got %s", d))
		}
	}
	if c.TestClockOffset < -time.Hour || c.TestClockOffset > time.Hour {
		errs = append(errs, config.Invalid(key("test_clock_offset"), "must be within ±1h (a test-only setting), got %s", c.TestClockOffset))
	}
	if c.MaxBackfill < 0 || c.MaxBackfill > 100_000 {
		errs = append(errs, config.Invalid(key("max_backfill"), "must be 0 (default %d) to 100000", DefaultMaxBackfill))
	}
	return errors.Join(errs...)
}

// ServiceConfig is the whole configuration of the scheduler service.
type ServiceConfig struct {
	service.Base `koanf:",squash"`
	Scheduler    Config `koanf:"scheduler"`
}

// DefaultHTTPAddr is where the scheduler service serves /metrics, /healthz
// and /readyz unless configured otherwise.
const DefaultHTTPAddr = "127.0.0.1:9102"

// DefaultServiceConfig returns the service's defaults.
func DefaultServiceConfig() *ServiceConfig {
	c := &ServiceConfig{}
	c.Telemetry.HTTPAddr = DefaultHTTPAddr
	return c
}

// Validate checks the shared sections and the scheduler section.
func (c *ServiceConfig) Validate() error {
	ttl := c.Topology.WithDefaults().LeaseTTL
	return errors.Join(c.Base.Validate(), c.Scheduler.Validate("scheduler", ttl))
}

// BuildFunc returns the service.BuildFunc of the scheduler service: it
// builds a Scheduler on the real clock and registers its readiness check
// (ready once the definitions and states are loaded).
func BuildFunc(cfg Config) service.BuildFunc {
	return func(_ context.Context, env *service.Env, http *telemetry.HTTPServer) (lifecycle.Component, error) {
		clk := clock.Real()
		if cfg.TestClockOffset != 0 {
			env.Logger.Warn("scheduler.test_clock_offset is set: this replica's schedule clock is moved (a test-only setting)",
				"offset", cfg.TestClockOffset.String())
			clk = clock.Offset(clk, cfg.TestClockOffset)
		}
		s, err := New(cfg, env, clk)
		if err != nil {
			return nil, err
		}
		if http != nil {
			http.AddReadyCheck("scheduler", s.Ready)
		}
		return s, nil
	}
}
