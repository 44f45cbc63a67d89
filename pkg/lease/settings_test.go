package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/jetfleet/jetfleet/pkg/lease"
)

func TestSettingsDefaultsAndValidation(t *testing.T) {
	const ttl = 4 * time.Second
	key := func(k string) string { return "svc." + k }

	s := lease.Settings{}.WithDefaults("svc", ttl)
	assert.Equal(t, lease.Settings{LeaseKey: "svc", RenewInterval: time.Second, AcquireInterval: 200 * time.Millisecond}, s)
	assert.Empty(t, s.Validate(key, ttl))

	bad := lease.Settings{LeaseKey: ".x", RenewInterval: 3 * time.Second, AcquireInterval: -time.Second}
	err := errors.Join(bad.Validate(key, ttl)...)
	assert.ErrorContains(t, err, "svc.lease_key")
	assert.ErrorContains(t, err, "svc.renew_interval: must be at most half of topology.lease_ttl")
	assert.ErrorContains(t, err, "svc.acquire_interval: must not be negative")
}
