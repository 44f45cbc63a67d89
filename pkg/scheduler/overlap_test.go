package scheduler_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// overlapFixture is a leader on a fake clock at 10:00:00, a runner whose
// jobs run until released, and a schedule firing every 10s with policy.
type overlapFixture struct {
	f      *fleet
	clk    *clock.Fake
	r      *replica
	run    *jobRunner
	gates  *gates
	events *scheduleEvents
	jobs   *jobEvents
}

const overlapStart = "2026-06-01T10:00:00Z"

func newOverlapFixture(t *testing.T, policy string) *overlapFixture {
	return newOverlapFixtureWith(t, policy, nil)
}

// newOverlapFixtureWith runs jobs with handle (nil: held until released).
func newOverlapFixtureWith(t *testing.T, policy string, handle func(ctx context.Context, job protocol.Job) error) *overlapFixture {
	f := newFleet(t, topology.Config{})
	o := &overlapFixture{f: f, clk: clock.NewFake(utc(overlapStart)), gates: newGates()}
	o.events = watchScheduleEvents(t, f.nc)
	o.jobs = watchJobEvents(t, f.nc)
	o.r = f.replica(scheduler.Config{}, o.clk)
	waitLeading(t, o.r)
	if handle == nil {
		handle = o.gates.hold
	}
	o.run = f.runner("default", handle)
	def := interval("ov", 10*time.Second, "work")
	def.Policy.Overlap = policy
	_, err := f.client.AddSchedule(ctx(t, 10*time.Second), def)
	require.NoError(t, err)
	require.NoError(t, o.r.WaitSynced(ctx(t, 10*time.Second)))
	return o
}

// at moves the clock to overlapStart + d and lets the leader act.
func (o *overlapFixture) at(t *testing.T, d time.Duration) {
	t.Helper()
	o.clk.Set(utc(overlapStart).Add(d))
	require.NoError(t, o.r.Kick(ctx(t, 10*time.Second)))
}

func nominalJob(d time.Duration) string { return "sched.ov." + itoa(utc(overlapStart).Add(d).Unix()) }

// finish releases a run and waits until the scheduler recorded its end.
func (o *overlapFixture) finish(t *testing.T, jobID string) {
	t.Helper()
	o.gates.release(jobID)
	o.jobs.waitFor(t, jobID, protocol.EventSucceeded)
	o.f.waitState(t, "ov", func(st map[string]any) bool { return st["running_job_id"] != jobID })
}

func TestOverlapSkip(t *testing.T) {
	t.Parallel()
	o := newOverlapFixture(t, jetfleet.OverlapSkip)
	o.at(t, 10*time.Second)
	o.run.waitStarted(nominalJob(10 * time.Second))
	o.at(t, 20*time.Second) // the 10s run is still going: skipped
	skipped := o.events.waitN(t, "ov", protocol.EventSkipped, 1)
	assert.Equal(t, "overlap", skipped[0].GetReason())
	assert.Equal(t, utc(overlapStart).Add(20*time.Second), skipped[0].GetNominalTime().AsTime())

	o.finish(t, nominalJob(10*time.Second))
	o.at(t, 30*time.Second)
	o.run.waitStarted(nominalJob(30 * time.Second))
	fired := o.events.waitN(t, "ov", protocol.EventFired, 2)
	assert.Equal(t, []time.Time{utc(overlapStart).Add(10 * time.Second), utc(overlapStart).Add(30 * time.Second)}, nominalTimes(fired))
	o.gates.release(nominalJob(30 * time.Second))
}

func TestOverlapBufferOne(t *testing.T) {
	t.Parallel()
	o := newOverlapFixture(t, jetfleet.OverlapBufferOne)
	o.at(t, 10*time.Second)
	o.run.waitStarted(nominalJob(10 * time.Second))
	o.at(t, 20*time.Second) // buffered
	o.at(t, 30*time.Second) // the buffer is full: skipped
	skipped := o.events.waitN(t, "ov", protocol.EventSkipped, 1)
	assert.Equal(t, "overlap_buffer_full", skipped[0].GetReason())
	assert.Equal(t, utc(overlapStart).Add(30*time.Second), skipped[0].GetNominalTime().AsTime())

	// When the running run succeeds, the buffered one fires at once, with
	// its own nominal time, and no clock move.
	o.gates.release(nominalJob(10 * time.Second))
	o.run.waitStarted(nominalJob(20 * time.Second))
	fired := o.events.waitN(t, "ov", protocol.EventFired, 2)
	assert.Equal(t, []time.Time{utc(overlapStart).Add(10 * time.Second), utc(overlapStart).Add(20 * time.Second)}, nominalTimes(fired))
	assert.Equal(t, "buffered", fired[1].GetReason())
	o.gates.release(nominalJob(20 * time.Second))
}

func TestOverlapCancelPrevious(t *testing.T) {
	t.Parallel()
	o := newOverlapFixture(t, jetfleet.OverlapCancelPrevious)
	o.at(t, 10*time.Second)
	first := nominalJob(10 * time.Second)
	o.run.waitStarted(first)
	o.at(t, 20*time.Second) // cancels the 10s run and fires
	second := nominalJob(20 * time.Second)
	cancelled := o.jobs.waitFor(t, first, protocol.EventCancelled)
	assert.Equal(t, protocol.ReasonCancelled, cancelled.GetReason())
	o.run.waitStarted(second)
	fired := o.events.waitN(t, "ov", protocol.EventFired, 2)
	assert.Equal(t, "cancel_previous "+first, fired[1].GetReason())
	assert.Empty(t, o.events.of("ov", protocol.EventSkipped))
	o.gates.release(second)
	o.jobs.waitFor(t, second, protocol.EventSucceeded)
	assert.Zero(t, fleettestStreamMsgs(t, o.f, protocol.StreamDLQ), "a cancelled run is not dead-lettered")
}

func fleettestStreamMsgs(t *testing.T, f *fleet, stream string) uint64 {
	t.Helper()
	s, err := f.js.Stream(ctx(t, 10*time.Second), stream)
	require.NoError(t, err)
	return s.CachedInfo().State.Msgs
}

func TestOverlapAllow(t *testing.T) {
	t.Parallel()
	o := newOverlapFixture(t, jetfleet.OverlapAllow)
	o.at(t, 10*time.Second)
	o.at(t, 20*time.Second)
	o.run.waitStarted(nominalJob(10 * time.Second))
	o.run.waitStarted(nominalJob(20 * time.Second)) // both run at once
	o.gates.release(nominalJob(10 * time.Second))
	o.gates.release(nominalJob(20 * time.Second))
	o.jobs.waitFor(t, nominalJob(20*time.Second), protocol.EventSucceeded)
	// The fired events follow the jobs' publication and may arrive after
	// the runs ended: wait for them rather than read them now.
	fired := o.events.waitN(t, "ov", protocol.EventFired, 2)
	assert.Equal(t, []time.Time{utc(overlapStart).Add(10 * time.Second), utc(overlapStart).Add(20 * time.Second)}, nominalTimes(fired))
	assert.Empty(t, o.events.of("ov", protocol.EventSkipped), "allow never skips")
}

// TestOverlapSurvivesFailover: a run started under one leader blocks the
// next fire under the next leader, which learns of its end from the events.
func TestOverlapSurvivesFailover(t *testing.T) {
	t.Parallel()
	o := newOverlapFixture(t, jetfleet.OverlapSkip)
	o.at(t, 10*time.Second)
	first := nominalJob(10 * time.Second)
	o.run.waitStarted(first)
	o.r.stop()
	next := o.f.replica(scheduler.Config{}, o.clk)
	waitLeading(t, next)
	o.r = next
	o.at(t, 20*time.Second)
	o.events.waitN(t, "ov", protocol.EventSkipped, 1)
	o.finish(t, first)
	o.at(t, 30*time.Second)
	o.run.waitStarted(nominalJob(30 * time.Second))
	o.gates.release(nominalJob(30 * time.Second))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
