package supervisor_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestQueueDepthGauge: the leader exports, per queue, the jobs pending,
// running and delayed (jetfleet_supervisor_queue_jobs).
func TestQueueDepthGauge(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	sup, _ := f.leader(t, supervisor.Config{}, nil)
	_, err := f.client.AddQueue(fleettest.Ctx(t, 10*time.Second), jetfleet.QueueAddRequest{Queue: "depth"})
	require.NoError(t, err)
	for i := range 3 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("d-%d", i), Queue: "depth", Kind: "echo"})
	}
	gauge := func(state string) (float64, bool) {
		families, err := sup.Registry().Gather()
		require.NoError(t, err)
		for _, mf := range families {
			if mf.GetName() != "jetfleet_supervisor_queue_jobs" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["queue"] == "depth" && labels["state"] == state {
					return m.GetGauge().GetValue(), true
				}
			}
		}
		return 0, false
	}
	// Measured every 5s: the next measure sees the three jobs.
	require.Eventually(t, func() bool { v, ok := gauge("pending"); return ok && v == 3 }, 15*time.Second, 100*time.Millisecond)
	for _, state := range []string{"running", "delayed"} {
		v, ok := gauge(state)
		require.True(t, ok, state)
		require.Zero(t, v, state)
	}
}
