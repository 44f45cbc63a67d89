package scheduler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
)

func TestShippedConfigLoads(t *testing.T) {
	t.Parallel()
	cfg := scheduler.DefaultServiceConfig()
	_, err := config.Load(cfg, config.Options{Files: []string{"../../config/scheduler.yaml"}, Environ: []string{}})
	require.NoError(t, err)
	assert.Equal(t, "scheduler", cfg.Scheduler.LeaseKey)
	assert.Equal(t, 10*time.Second, cfg.Scheduler.MisfireThreshold)
	assert.Equal(t, scheduler.DefaultHTTPAddr, cfg.Telemetry.HTTPAddr)
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	cfg := scheduler.DefaultServiceConfig()
	_, err := config.Load(cfg, config.Options{Environ: []string{}, Sets: []string{
		"scheduler.renew_interval=4s", "topology.lease_ttl=5s", "scheduler.max_backfill=-1", "scheduler.lease_key=.bad",
	}})
	require.Error(t, err)
	for _, key := range []string{"scheduler.renew_interval", "scheduler.max_backfill", "scheduler.lease_key"} {
		assert.ErrorContains(t, err, "config key "+key)
	}
}
