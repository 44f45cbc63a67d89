package lease

import (
	"time"

	"github.com/jetfleet/jetfleet/pkg/config"
)

// Settings are the lease settings of a service's configuration section,
// squashed into it (`koanf:",squash"`), so their keys sit in the section.
type Settings struct {
	// LeaseKey is the key of the leader lease in bucket leases. Replicas
	// with the same key compete for one leadership. Defaults to the
	// service's name.
	LeaseKey string `koanf:"lease_key"`
	// RenewInterval is how often the leader renews its lease. Defaults to a
	// quarter of topology.lease_ttl; at most half of it.
	RenewInterval time.Duration `koanf:"renew_interval"`
	// AcquireInterval is how often a follower tries to take a free lease.
	// Defaults to a twentieth of topology.lease_ttl; at most all of it.
	AcquireInterval time.Duration `koanf:"acquire_interval"`
}

// WithDefaults fills zero values; ttl is topology.lease_ttl.
func (s Settings) WithDefaults(defaultKey string, ttl time.Duration) Settings {
	if s.LeaseKey == "" {
		s.LeaseKey = defaultKey
	}
	if s.RenewInterval == 0 {
		s.RenewInterval = ttl / 4
	}
	if s.AcquireInterval == 0 {
		s.AcquireInterval = ttl / 20
	}
	return s
}

// Validate checks s against ttl (topology.lease_ttl); key names a setting
// in its section ("renew_interval" → "scheduler.renew_interval").
func (s Settings) Validate(key func(string) string, ttl time.Duration) []error {
	var errs []error
	if s.LeaseKey != "" && !ValidKey(s.LeaseKey) {
		errs = append(errs, config.Invalid(key("lease_key"), "must be a key-value key: letters, digits, '-', '_', '/', '=' or '.'"))
	}
	switch {
	case s.RenewInterval < 0:
		errs = append(errs, config.Invalid(key("renew_interval"), "must not be negative, got %s", s.RenewInterval))
	case s.RenewInterval > ttl/2:
		errs = append(errs, config.Invalid(key("renew_interval"), "must be at most half of topology.lease_ttl (%s), got %s", ttl, s.RenewInterval))
	}
	switch {
	case s.AcquireInterval < 0:
		errs = append(errs, config.Invalid(key("acquire_interval"), "must not be negative, got %s", s.AcquireInterval))
	case s.AcquireInterval > ttl:
		errs = append(errs, config.Invalid(key("acquire_interval"), "must be at most topology.lease_ttl (%s), got %s", ttl, s.AcquireInterval))
	}
	return errs
}
