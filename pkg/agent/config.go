package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Config configures an Agent (the "agent" section of the agent service's
// configuration). Zero values mean the documented default.
type Config struct {
	// ID identifies the agent in heartbeats and on its control subject.
	// Defaults to <hostname>-<pid>-<random>; must be unique in the fleet.
	ID string `koanf:"id"`
	// Queues to pull jobs from. Defaults to [default].
	Queues []string `koanf:"queues"`
	// Concurrency is the most jobs the agent runs at once, across queues. Defaults to 10.
	Concurrency int `koanf:"concurrency"`
	// Prefetch is how many jobs the agent holds beyond Concurrency, pulled
	// ahead and waiting for a free slot (kept alive by +WPI meanwhile), so
	// a slot that frees starts its next job without waiting for a delivery.
	// On a replicated cluster a delivery waits for the consumer's quorum, a
	// round trip that bounds an agent of short jobs at Concurrency per round
	// trip. Defaults to 0: a job waiting here is one another agent could
	// run now, so leave it off where jobs are long.
	Prefetch int `koanf:"prefetch"`
	// HeartbeatInterval between heartbeats. Defaults to 1s.
	HeartbeatInterval time.Duration `koanf:"heartbeat_interval"`
	// DefaultTimeout bounds an attempt of a kind with no timeout of its own
	// and a message without Jetfleet-Timeout. Defaults to 30m.
	DefaultTimeout time.Duration `koanf:"default_timeout"`
	// Retry is the policy of kinds that set none.
	Retry RetryConfig `koanf:"retry"`
	// MaxPayload dead-letters jobs with a larger body (reason
	// payload_too_large). Defaults to no limit beyond the stream's.
	MaxPayload config.ByteSize `koanf:"max_payload"`
	// FetchMaxWait is how long one pull request waits for jobs. Short waits
	// let a stopping agent hand back nothing it did not start. Defaults to 1s.
	FetchMaxWait time.Duration `koanf:"fetch_max_wait"`
	// OutputTail is how many bytes of a job's output are kept in its events
	// and dead letter. Defaults to 4KiB.
	OutputTail config.ByteSize `koanf:"output_tail"`
	// MaxResult bounds a job's result (RecordResult), stored with its
	// succeeded event. Defaults to 64KiB; at most 256KiB.
	MaxResult config.ByteSize `koanf:"max_result"`
	// StartedEventAfter publishes a job's started event once it has run this
	// long; quicker jobs only get their terminal event, which carries
	// started_at too. This keeps bookkeeping to one stored event for most
	// jobs. Defaults to 1s; a negative value publishes every started event
	// at once.
	StartedEventAfter time.Duration `koanf:"started_event_after"`
	// MaxUnconfirmed bounds the finished jobs whose outcome event, or whose
	// ack after it, the server has not confirmed yet: a job is acked only
	// once its outcome is stored, and past this many the agent keeps a
	// finished job's slot until its outcome is, so it pulls fewer jobs while
	// the server is slow (every write synced, a busy disk) instead of piling
	// up events and acks it cannot store in time — and the memory they hold.
	// Defaults to 1000.
	MaxUnconfirmed int `koanf:"max_unconfirmed"`
	// Middleware runs around every handler, inside Timeout and outside Recover.
	Middleware []Middleware `koanf:"-"`
}

// RetryConfig is the configurable part of a RetryPolicy.
type RetryConfig struct {
	MaxAttempts  int           `koanf:"max_attempts"`
	InitialDelay time.Duration `koanf:"initial_delay"`
	Multiplier   float64       `koanf:"multiplier"`
	MaxDelay     time.Duration `koanf:"max_delay"`
	Jitter       float64       `koanf:"jitter"`
}

// WithDefaults returns c with zero values replaced by the policy defaults.
func (c RetryConfig) WithDefaults() RetryConfig {
	p := c.Policy().WithDefaults()
	return RetryConfig{MaxAttempts: p.MaxAttempts, InitialDelay: p.InitialDelay, Multiplier: p.Multiplier,
		MaxDelay: p.MaxDelay, Jitter: p.Jitter}
}

// Policy converts c to a RetryPolicy.
func (c RetryConfig) Policy() RetryPolicy {
	return RetryPolicy{MaxAttempts: c.MaxAttempts, InitialDelay: c.InitialDelay, Multiplier: c.Multiplier,
		MaxDelay: c.MaxDelay, Jitter: c.Jitter}
}

// Validate checks the retry settings; keys are reported below section.
func (c RetryConfig) Validate(section string) error {
	var errs []error
	if c.MaxAttempts < 0 {
		errs = append(errs, config.Invalid(section+".max_attempts", "must not be negative"))
	}
	if c.InitialDelay < 0 || c.MaxDelay < 0 {
		errs = append(errs, config.Invalid(section+".initial_delay", "delays must not be negative"))
	}
	if c.Multiplier != 0 && c.Multiplier < 1 {
		errs = append(errs, config.Invalid(section+".multiplier", "must be at least 1, got %g", c.Multiplier))
	}
	if c.Jitter > 1 {
		errs = append(errs, config.Invalid(section+".jitter", "must be at most 1, got %g", c.Jitter))
	}
	return errors.Join(errs...)
}

// slots is how many jobs the agent holds at once: those it runs and those
// it pulled ahead.
func (c Config) slots() int { return c.Concurrency + c.Prefetch }

// Defaults of Config.
const (
	DefaultConcurrency       = 10
	DefaultHeartbeatInterval = time.Second
	DefaultTimeout           = 30 * time.Minute
	DefaultFetchMaxWait      = time.Second
	DefaultStartedEventAfter = time.Second
	DefaultMaxUnconfirmed    = 1000
	DefaultQueue             = "default"
)

// WithDefaults returns c with zero values replaced by defaults.
func (c Config) WithDefaults() Config {
	if c.ID == "" {
		c.ID = defaultID()
	}
	if len(c.Queues) == 0 {
		c.Queues = []string{DefaultQueue}
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = DefaultTimeout
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = DefaultFetchMaxWait
	}
	if c.OutputTail == 0 {
		c.OutputTail = DefaultOutputTail
	}
	if c.MaxResult == 0 {
		c.MaxResult = DefaultMaxResult
	}
	if c.StartedEventAfter == 0 {
		c.StartedEventAfter = DefaultStartedEventAfter
	}
	if c.MaxUnconfirmed == 0 {
		c.MaxUnconfirmed = DefaultMaxUnconfirmed
	}
	c.Retry = c.Retry.WithDefaults()
	return c
}

// Validate checks c; keys are reported below section (for example "agent").
func (c Config) Validate(section string) error {
	var errs []error
	key := func(k string) string { return section + "." + k }
	if c.ID != "" {
		if err := protocol.ValidateToken("agent id", c.ID); err != nil {
			errs = append(errs, config.Invalid(key("id"), "%v", err))
		}
	}
	for _, q := range c.Queues {
		if err := protocol.ValidateToken("queue", q); err != nil {
			errs = append(errs, config.Invalid(key("queues"), "%v", err))
		}
	}
	if c.Concurrency < 0 {
		errs = append(errs, config.Invalid(key("concurrency"), "must be at least 1, got %d", c.Concurrency))
	}
	if c.Prefetch < 0 {
		errs = append(errs, config.Invalid(key("prefetch"), "must not be negative, got %d", c.Prefetch))
	}
	if c.HeartbeatInterval < 0 || (c.HeartbeatInterval > 0 && c.HeartbeatInterval < 50*time.Millisecond) {
		errs = append(errs, config.Invalid(key("heartbeat_interval"), "must be at least 50ms, got %s", c.HeartbeatInterval))
	}
	if c.DefaultTimeout < 0 {
		errs = append(errs, config.Invalid(key("default_timeout"), "must not be negative"))
	}
	if c.FetchMaxWait < 0 || (c.FetchMaxWait > 0 && c.FetchMaxWait < 10*time.Millisecond) {
		errs = append(errs, config.Invalid(key("fetch_max_wait"), "must be at least 10ms, got %s", c.FetchMaxWait))
	}
	if c.MaxPayload < 0 {
		errs = append(errs, config.Invalid(key("max_payload"), "must not be negative"))
	}
	if c.OutputTail < 0 || c.OutputTail > MaxOutputTail {
		errs = append(errs, config.Invalid(key("output_tail"), "must be 0 to %s (it travels in events and dead letters), got %s", config.ByteSize(MaxOutputTail), c.OutputTail))
	}
	if c.MaxResult < 0 || c.MaxResult > MaxResult {
		errs = append(errs, config.Invalid(key("max_result"), "must be 0 to %s (a result travels in the succeeded event), got %s", config.ByteSize(MaxResult), c.MaxResult))
	}
	if c.MaxUnconfirmed < 0 {
		errs = append(errs, config.Invalid(key("max_unconfirmed"), "must be at least 1, got %d", c.MaxUnconfirmed))
	}
	errs = append(errs, c.Retry.Validate(key("retry")))
	return errors.Join(errs...)
}

var notTokenChars = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

func defaultID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "agent"
	}
	host = notTokenChars.ReplaceAllString(host, "-")
	if len(host) > 64 {
		host = host[:64]
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// KindOptions configure one job kind. Zero values inherit from the agent.
type KindOptions struct {
	// Timeout bounds an attempt when the message sets none.
	Timeout time.Duration
	// Retry overrides the agent's policy field by field.
	Retry RetryPolicy
	// Concurrency caps how many jobs of this kind run at once on the agent;
	// 0 means only the agent's concurrency applies.
	Concurrency int
}
