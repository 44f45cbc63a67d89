package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/jetfleet/jetfleet/pkg/agent"
)

// TestSchedulingDelayMeasuresToTheHandlersStart: a scheduled job's first
// attempt records the time from its nominal time to its handler's start,
// labelled with its schedule; retries and unscheduled jobs record nothing.
func TestSchedulingDelayMeasuresToTheHandlersStart(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	h := agent.Chain(func(context.Context, *agent.Job) error { return nil }, agent.SchedulingDelay(mp))
	nominal := time.Now().Add(-2 * time.Second)
	for _, job := range []*agent.Job{
		{Queue: "reports", Kind: "daily", ScheduleID: "nightly", NominalTime: nominal, Attempt: 1, Delivered: 1},
		{Queue: "reports", Kind: "daily", ScheduleID: "nightly", NominalTime: nominal, Attempt: 2, Delivered: 2}, // a retry
		{Queue: "reports", Kind: "daily", Attempt: 1, Delivered: 1},                                              // not scheduled
	} {
		require.NoError(t, h(context.Background(), job))
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var found bool
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "jetfleet.agent.scheduling_delay" {
				continue
			}
			hist := m.Data.(metricdata.Histogram[float64])
			require.Len(t, hist.DataPoints, 1)
			dp := hist.DataPoints[0]
			assert.Equal(t, uint64(1), dp.Count, "the first attempt only")
			assert.GreaterOrEqual(t, dp.Sum, 2.0)
			v, ok := dp.Attributes.Value("schedule")
			assert.True(t, ok)
			assert.Equal(t, "nightly", v.AsString())
			found = true
		}
	}
	assert.True(t, found, "jetfleet.agent.scheduling_delay recorded")
}
