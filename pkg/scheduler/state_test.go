package scheduler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// stateOf reads the stored state of schedule id: its revision and document.
func (f *fleet) stateOf(t *testing.T, id string) (uint64, []byte) {
	t.Helper()
	c := ctx(t, 10*time.Second)
	kv, err := f.js.KeyValue(c, protocol.BucketScheduleState)
	require.NoError(t, err)
	kve, err := kv.Get(c, id)
	require.NoError(t, err, "the state of %s", id)
	return kve.Revision(), kve.Value()
}

// jobsOf counts the messages in JOBS of each job id of schedule id.
func (f *fleet) jobsOf(t *testing.T, id string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range f.jobMessages(t) {
		if m.header.Get(protocol.HeaderScheduleID) == id {
			out[m.id]++
		}
	}
	return out
}

func lastNominalIs(at time.Time) func(map[string]any) bool {
	want := at.UTC().Format(time.RFC3339)
	return func(st map[string]any) bool { return st["last_nominal"] == want }
}

// TestAddOfALiveIDLeavesItsStateAlone: adding a schedule whose id exists is
// refused, and the live schedule keeps its state: it neither fires a
// nominal time again nor loses its cursor.
func TestAddOfALiveIDLeavesItsStateAlone(t *testing.T) {
	t.Parallel()
	rf := newRunFixture(t)
	rf.add(t, "tick", 10*time.Second, jetfleet.OverlapAllow)
	c := ctx(t, 30*time.Second)
	rf.at(t, 10*time.Second)
	rf.f.waitState(t, "tick", lastNominalIs(utc(overlapStart).Add(10*time.Second)))
	rev, doc := rf.f.stateOf(t, "tick")

	_, err := rf.f.client.AddSchedule(c, interval("tick", 10*time.Second, "work"))
	require.ErrorIs(t, err, protocol.Code(protocol.CodeAlreadyExists))
	gotRev, gotDoc := rf.f.stateOf(t, "tick")
	assert.Equal(t, rev, gotRev, "the state was not written")
	assert.JSONEq(t, string(doc), string(gotDoc))

	// The leader saw nothing change: the same time fires nothing again.
	require.NoError(t, rf.r.WaitSynced(c))
	rf.at(t, 10*time.Second)
	rf.at(t, 20*time.Second)
	rf.f.waitState(t, "tick", lastNominalIs(utc(overlapStart).Add(20*time.Second)))
	assert.Equal(t, 2.0, counterValue(t, rf.r.env.Telemetry.Registry, "jetfleet_scheduler_fires_total"))
	assert.Equal(t, 0.0, counterValue(t, rf.r.env.Telemetry.Registry, "jetfleet_scheduler_duplicates_total"))
	assert.Equal(t, map[string]int{nominalJobOf("tick", 10*time.Second): 1, nominalJobOf("tick", 20*time.Second): 1}, rf.f.jobsOf(t, "tick"))
	// Schedule events follow the state write: wait for them.
	assert.Len(t, rf.events.waitN(t, "tick", protocol.EventFired, 2), 2)
}

// TestRemovedScheduleAddedAgainFiresNormally: after rm, the state key holds
// a purge marker; the schedule added again under the same id writes its
// state after it, and fires once per nominal time.
func TestRemovedScheduleAddedAgainFiresNormally(t *testing.T) {
	t.Parallel()
	rf := newRunFixture(t)
	rf.add(t, "re", 10*time.Second, jetfleet.OverlapAllow)
	c := ctx(t, 30*time.Second)
	rf.at(t, 10*time.Second)
	rf.f.waitState(t, "re", lastNominalIs(utc(overlapStart).Add(10*time.Second)))

	require.NoError(t, rf.f.client.RemoveSchedule(c, "re"))
	require.NoError(t, rf.r.WaitSynced(c))
	rf.add(t, "re", 10*time.Second, jetfleet.OverlapAllow)

	rf.at(t, 20*time.Second)
	rf.f.waitState(t, "re", lastNominalIs(utc(overlapStart).Add(20*time.Second)))
	rf.at(t, 30*time.Second)
	rf.f.waitState(t, "re", lastNominalIs(utc(overlapStart).Add(30*time.Second)))

	info, err := rf.f.client.GetSchedule(c, "re")
	require.NoError(t, err)
	require.NotNil(t, info.State)
	assert.Equal(t, uint64(2), info.State.Fires, "the state counts the fires since the schedule was added again")
	assert.Equal(t, 3.0, counterValue(t, rf.r.env.Telemetry.Registry, "jetfleet_scheduler_fires_total"), "one publish per fire: %s", rf.events.summary())
	assert.Equal(t, map[string]int{nominalJobOf("re", 10*time.Second): 1, nominalJobOf("re", 20*time.Second): 1, nominalJobOf("re", 30*time.Second): 1},
		rf.f.jobsOf(t, "re"))
}

// TestStateMarkerDoesNotRewindALiveSchedule: rm deletes the definition and
// purges the state, and a replica's watches may deliver the purge marker
// first. Until the delete arrives the schedule is live, and the marker must
// not make it fire again what it fired.
func TestStateMarkerDoesNotRewindALiveSchedule(t *testing.T) {
	t.Parallel()
	rf := newRunFixture(t)
	rf.add(t, "mk", 10*time.Second, jetfleet.OverlapAllow)
	c := ctx(t, 30*time.Second)
	rf.at(t, 10*time.Second)
	rf.f.waitState(t, "mk", lastNominalIs(utc(overlapStart).Add(10*time.Second)))
	kv, err := rf.f.js.KeyValue(c, protocol.BucketScheduleState)
	require.NoError(t, err)
	require.NoError(t, kv.Purge(c, "mk")) // the marker of rm, before its definition delete
	require.NoError(t, rf.r.WaitSynced(c))

	rf.at(t, 10*time.Second)
	rf.at(t, 20*time.Second)
	rf.f.waitState(t, "mk", lastNominalIs(utc(overlapStart).Add(20*time.Second)))
	assert.Equal(t, 2.0, counterValue(t, rf.r.env.Telemetry.Registry, "jetfleet_scheduler_fires_total"), "10s fired once: %s", rf.events.summary())
	assert.Equal(t, map[string]int{nominalJobOf("mk", 10*time.Second): 1, nominalJobOf("mk", 20*time.Second): 1}, rf.f.jobsOf(t, "mk"))
}

// TestStateWriteAfterAMarkerItMissedRecovers: a replica expects the wrong
// revision of a state key whose last message is a purge marker (its watch
// has not delivered the marker yet). The conflicting write makes it read the
// marker's sequence, and its next write succeeds: the schedule fires once per
// nominal time, with a bounded number of publishes.
func TestStateWriteAfterAMarkerItMissedRecovers(t *testing.T) {
	t.Parallel()
	rf := newRunFixture(t)
	rf.add(t, "mk", 10*time.Second, jetfleet.OverlapAllow)
	c := ctx(t, 30*time.Second)
	kv, err := rf.f.js.KeyValue(c, protocol.BucketScheduleState)
	require.NoError(t, err)
	require.NoError(t, kv.Purge(c, "mk")) // a marker, and no value
	require.NoError(t, rf.r.WaitSynced(c))
	require.NoError(t, rf.r.RewindStateRevision(c, "mk", 0))

	rf.at(t, 10*time.Second)
	rf.f.waitState(t, "mk", lastNominalIs(utc(overlapStart).Add(10*time.Second)))
	rf.at(t, 20*time.Second)
	rf.f.waitState(t, "mk", lastNominalIs(utc(overlapStart).Add(20*time.Second)))

	reg := rf.r.env.Telemetry.Registry
	assert.LessOrEqual(t, counterValue(t, reg, "jetfleet_scheduler_fires_total"), 3.0, "the fire repeated once after the conflict, at most")
	assert.LessOrEqual(t, counterValue(t, reg, "jetfleet_scheduler_duplicates_total"), 1.0)
	assert.Equal(t, map[string]int{nominalJobOf("mk", 10*time.Second): 1, nominalJobOf("mk", 20*time.Second): 1}, rf.f.jobsOf(t, "mk"))
}

func nominalJobOf(id string, d time.Duration) string {
	return "sched." + id + "." + itoa(utc(overlapStart).Add(d).Unix())
}
