package agent

import (
	"errors"
	"math"
	"math/rand/v2"
	"time"
)

// RetryPolicy decides how often and how soon a failed job runs again. Zero
// fields take the defaults below. A job's Jetfleet-Max-Attempts and
// Jetfleet-Backoff headers override MaxAttempts and the computed delays.
type RetryPolicy struct {
	// MaxAttempts before the job is dead-lettered. Defaults to 5.
	MaxAttempts int
	// InitialDelay before the first retry. Defaults to 1s.
	InitialDelay time.Duration
	// Multiplier grows the delay per retry. Defaults to 2.
	Multiplier float64
	// MaxDelay caps a delay. Defaults to 5m.
	MaxDelay time.Duration
	// Jitter spreads each delay by ±this fraction. Defaults to 0.2; negative disables it.
	Jitter float64
	// NonRetryable errors (matched with errors.Is) fail the job at once.
	NonRetryable []error
}

// Retry policy defaults.
const (
	DefaultMaxAttempts  = 5
	DefaultInitialDelay = time.Second
	DefaultMultiplier   = 2.0
	DefaultMaxDelay     = 5 * time.Minute
	DefaultJitter       = 0.2
)

// WithDefaults returns p with zero fields set to their defaults.
func (p RetryPolicy) WithDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.InitialDelay == 0 {
		p.InitialDelay = DefaultInitialDelay
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.Jitter == 0 {
		p.Jitter = DefaultJitter
	}
	return p
}

// Delay is the wait before the attempt after failed attempt number attempt
// (1-based), without jitter.
func (p RetryPolicy) Delay(attempt int) time.Duration {
	p = p.WithDefaults()
	d := float64(p.InitialDelay) * math.Pow(p.Multiplier, float64(max(attempt-1, 0)))
	if d > float64(p.MaxDelay) || math.IsInf(d, 0) || math.IsNaN(d) {
		return p.MaxDelay
	}
	return time.Duration(d)
}

// jittered spreads d by ±p.Jitter using rnd in [0,1).
func (p RetryPolicy) jittered(d time.Duration, rnd float64) time.Duration {
	p = p.WithDefaults()
	if p.Jitter <= 0 {
		return d
	}
	return time.Duration(float64(d) * (1 + p.Jitter*(2*rnd-1)))
}

// backoffFor is the delay before the next attempt after failed attempt
// number attempt: the message's Jetfleet-Backoff list when it has one,
// else the policy's exponential delay; both jittered.
func (p RetryPolicy) backoffFor(attempt int, fromHeader []time.Duration) time.Duration {
	d := p.Delay(attempt)
	if len(fromHeader) > 0 {
		d = fromHeader[min(attempt-1, len(fromHeader)-1)]
	}
	return p.jittered(d, rand.Float64())
}

func (p RetryPolicy) isNonRetryable(err error) bool {
	for _, target := range p.NonRetryable {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
