package scheduler_test

import (
	"context"
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

// TestCatchUpAfterDowntime stops the only replica after a fire, moves the
// clock 65s (six nominal times of a 10s schedule pass, the latest 5s ago),
// and starts a new replica. With a misfire threshold of 2s all six are
// misfires; what the new leader fires, and reports missed, follows the
// policy. Every fired job runs on a real runner to its succeeded event.
func TestCatchUpAfterDowntime(t *testing.T) {
	t.Parallel()
	base := utc("2026-06-01T10:00:00Z")
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	tests := []struct {
		name       string
		policy     jetfleet.Policy
		wantFired  []time.Time
		wantMissed map[string]uint32 // reason → count
	}{
		{"fire_all fires each", jetfleet.Policy{Misfire: jetfleet.MisfireFireAll},
			[]time.Time{at(20), at(30), at(40), at(50), at(60), at(70)}, nil},
		{"fire_all is bounded by max_catch_up", jetfleet.Policy{Misfire: jetfleet.MisfireFireAll, MaxCatchUp: 2},
			[]time.Time{at(60), at(70)}, map[string]uint32{"max_catch_up": 4}},
		{"fire_once fires the latest", jetfleet.Policy{Misfire: jetfleet.MisfireFireOnce},
			[]time.Time{at(70)}, map[string]uint32{"misfire_fire_once": 5}},
		{"skip fires none", jetfleet.Policy{Misfire: jetfleet.MisfireSkip},
			[]time.Time{}, map[string]uint32{"misfire_skip": 6}},
		{"outside the catch-up window", jetfleet.Policy{Misfire: jetfleet.MisfireFireAll, CatchUpWindow: jetfleet.Duration(30 * time.Second)},
			[]time.Time{at(50), at(60), at(70)}, map[string]uint32{"outside_catch_up_window": 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFleet(t, topology.Config{})
			events := watchScheduleEvents(t, f.nc)
			jobs := watchJobEvents(t, f.nc)
			f.runner("default", func(context.Context, protocol.Job) error { return nil })
			clk := clock.NewFake(base)
			cfg := scheduler.Config{MisfireThreshold: 2 * time.Second}
			first := f.replica(cfg, clk)
			waitLeading(t, first)
			def := interval("cu", 10*time.Second, "work")
			def.Policy = tt.policy
			_, err := f.client.AddSchedule(ctx(t, 10*time.Second), def)
			require.NoError(t, err)
			require.NoError(t, first.WaitSynced(ctx(t, 10*time.Second)))
			clk.Set(at(10))
			require.NoError(t, first.Kick(ctx(t, 10*time.Second)))
			jobs.waitFor(t, "sched.cu."+itoa(at(10).Unix()), protocol.EventSucceeded)
			first.stop()

			clk.Set(at(75))
			second := f.replica(cfg, clk)
			waitLeading(t, second)
			require.NoError(t, second.Kick(ctx(t, 10*time.Second)))
			// One more fire, on time: once its event arrives, every event of
			// the catch-up before it has arrived too.
			clk.Set(at(80))
			require.NoError(t, second.Kick(ctx(t, 10*time.Second)))
			fired := events.waitN(t, "cu", protocol.EventFired, 2+len(tt.wantFired))
			require.Equal(t, at(80), fired[len(fired)-1].GetNominalTime().AsTime(), events.summary())
			fired = fired[1 : len(fired)-1]
			assert.Equal(t, tt.wantFired, nominalTimes(fired))
			for _, ev := range fired {
				assert.Equal(t, "catch_up", ev.GetReason())
				jobs.waitFor(t, ev.GetJobId(), protocol.EventSucceeded)
			}
			missed := map[string]uint32{}
			for _, ev := range events.of("cu", protocol.EventMissed) {
				missed[ev.GetReason()] += ev.GetCount()
			}
			if tt.wantMissed == nil {
				tt.wantMissed = map[string]uint32{}
			}
			assert.Equal(t, tt.wantMissed, missed)
			info, err := f.client.GetSchedule(ctx(t, 10*time.Second), "cu")
			require.NoError(t, err)
			assert.Equal(t, at(80), info.State.LastNominal, "every passed nominal time is handled")
		})
	}
}

// TestFailoverLatenessIsNotAMisfire: fires that are late by less than the
// misfire threshold (a failover) all fire, even under misfire skip.
func TestFailoverLatenessIsNotAMisfire(t *testing.T) {
	t.Parallel()
	f := newFleet(t, haTopology)
	events := watchScheduleEvents(t, f.nc)
	clk := clock.NewFake(utc("2026-06-01T10:00:00Z"))
	first := f.replica(scheduler.Config{}, clk)
	waitLeading(t, first)
	def := interval("late", time.Second, "work")
	def.Policy.Misfire = jetfleet.MisfireSkip
	_, err := f.client.AddSchedule(ctx(t, 10*time.Second), def)
	require.NoError(t, err)
	require.NoError(t, first.WaitSynced(ctx(t, 10*time.Second)))
	clk.Set(utc("2026-06-01T10:00:01Z"))
	require.NoError(t, first.Kick(ctx(t, 10*time.Second)))
	first.kill()
	clk.Set(utc("2026-06-01T10:00:07Z")) // 6s later, within the default 10s threshold
	second := f.replica(scheduler.Config{}, clk)
	waitLeading(t, second)
	require.NoError(t, second.Kick(ctx(t, 10*time.Second)))
	fired := events.waitN(t, "late", protocol.EventFired, 7)
	assert.Len(t, fired, 7)
	assert.Empty(t, events.of("late", protocol.EventMissed))
}
