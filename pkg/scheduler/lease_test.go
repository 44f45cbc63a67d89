package scheduler_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
)

// TestLeaseRenewalWithALostReplyKeepsTheLease: a renewal is stored but its
// reply never reaches the leader, whose next renewal then expects an old
// revision. The leader finds the lease still its own, adopts the revision and
// renews on: it does not step down and leave the fleet without a leader.
func TestLeaseRenewalWithALostReplyKeepsTheLease(t *testing.T) {
	t.Parallel()
	f := newFleet(t, haTopology)
	r := f.replica(scheduler.Config{}, clock.Real())
	waitLeading(t, r)
	c := ctx(t, 30*time.Second)
	leases, err := f.js.KeyValue(c, protocol.BucketLeases)
	require.NoError(t, err)
	w, err := leases.Watch(c, scheduler.DefaultLeaseKey)
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()

	unseen, err := r.RenewLeaseUnseen(c)
	require.NoError(t, err)
	var holder string
	for kve := range w.Updates() {
		if kve == nil || kve.Revision() <= unseen {
			continue
		}
		var v struct {
			Holder string `json:"holder"`
		}
		require.NoError(t, json.Unmarshal(kve.Value(), &v))
		holder = v.Holder
		break // the leader's next renewal, after the one it did not see
	}
	require.NotEmpty(t, holder, "the lease was renewed")
	require.NoError(t, r.WaitSynced(c)) // the engine has seen any leadership change
	assert.True(t, r.HoldsLease())
	assert.True(t, r.IsLeader())
	assert.Equal(t, 1.0, counterValue(t, r.env.Telemetry.Registry, "jetfleet_scheduler_leader_changes_total"),
		"leadership was gained once and never lost")
}
