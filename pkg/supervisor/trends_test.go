package supervisor_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// publishRun stores a finished run's event as an agent would.
func publishRun(t *testing.T, f *fixture, n int, typ string, at time.Time, d time.Duration) {
	t.Helper()
	ev := &jetfleetpb.JobEvent{Type: typ, JobId: fmt.Sprintf("run-%d", n), Queue: "default", Kind: "report", Attempt: 1,
		AgentId: "a1", Time: timestamppb.New(at), Duration: durationpb.New(d), StreamSequence: uint64(n), Delivered: 1,
		ScheduleId: "nightly", NominalTime: timestamppb.New(at.Add(-d - 50*time.Millisecond)), StartedAt: timestamppb.New(at.Add(-d))}
	if typ == protocol.EventDead {
		ev.Reason = protocol.ReasonMaxAttempts
	}
	data, err := protocol.Marshal(ev)
	require.NoError(t, err)
	_, err = f.js.PublishMsg(fleettest.Ctx(t, 5*time.Second), &nats.Msg{Data: data,
		Subject: protocol.JobEventSubject("default", "report", typ, ev.GetJobId())})
	require.NoError(t, err)
}

func trendsConfig() supervisor.Config {
	return supervisor.Config{Trends: supervisor.TrendsConfig{RecentWindow: 5 * time.Minute, BaselineWindow: 6 * time.Hour,
		MinRecentRuns: 5, MinBaselineRuns: 10, EvaluateInterval: time.Millisecond}}
}

// TestTrendsMarkASlowKindDegradingAndSurviveFailover: a kind whose runs
// took 10ms for hours and now take 200ms is marked degrading (status, a
// degrading event, an alert); the buckets count every run once, also
// after the leader changes and events are read again.
func TestTrendsMarkASlowKindDegradingAndSurviveFailover(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	trendEvents := make(chan *nats.Msg, 16)
	sub, err := f.nc.ChanSubscribe(protocol.TrendEventsSubjects, trendEvents)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	alerts := make(chan *nats.Msg, 16)
	asub, err := f.nc.ChanSubscribe(protocol.AlertsSubjects, alerts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = asub.Unsubscribe() })

	now := time.Now()
	n := 0
	for i := 0; i < 30; i++ { // the baseline: 2 hours ago, fast
		n++
		publishRun(t, f, n, protocol.EventSucceeded, now.Add(-2*time.Hour).Add(time.Duration(i)*time.Second), 10*time.Millisecond)
	}
	_, stop := f.leader(t, trendsConfig(), nil)
	require.Eventually(t, func() bool {
		res, err := f.client.Trends(fleettest.Ctx(t, 5*time.Second), jetfleet.TrendsRequest{Queue: "default", Kind: "report", Resolution: "h", Since: now.Add(-3 * time.Hour)})
		if err != nil {
			return false
		}
		runs := 0 // in one or two hour buckets: the 30 seconds may span an hour's end
		for _, b := range res.Buckets {
			runs += b.Runs
		}
		return runs == 30
	}, 20*time.Second, 50*time.Millisecond, "30 runs in the hour buckets")

	stop() // a new leader continues from the stored cursor
	f.leader(t, trendsConfig(), nil)
	for i := 0; i < 6; i++ { // now, slow
		n++
		publishRun(t, f, n, protocol.EventSucceeded, now.Add(-time.Duration(i)*time.Second), 200*time.Millisecond)
	}
	select {
	case m := <-trendEvents:
		var ev jetfleet.TrendEvent
		require.NoError(t, json.Unmarshal(m.Data, &ev))
		assert.Equal(t, protocol.EventDegrading, ev.Type)
		assert.Contains(t, []string{"kind.default.report", "schedule.nightly"}, ev.Series)
		assert.NotEmpty(t, ev.Reasons)
	case <-time.After(15 * time.Second):
		t.Fatal("no degrading event")
	}
	list, err := f.client.TrendList(fleettest.Ctx(t, 5*time.Second))
	require.NoError(t, err)
	require.NotEmpty(t, list.Series)
	assert.True(t, list.Series[0].Degrading, "degrading series first: %+v", list.Series)
	res, err := f.client.Trends(fleettest.Ctx(t, 5*time.Second), jetfleet.TrendsRequest{ScheduleID: "nightly", Resolution: "h", Since: now.Add(-3 * time.Hour)})
	require.NoError(t, err)
	total := 0
	for _, b := range res.Buckets {
		total += b.Runs
	}
	assert.Equal(t, 36, total, "every run counted once across the failover")
	assert.Greater(t, res.Buckets[len(res.Buckets)-1].P95(), 100*time.Millisecond)
	assert.Greater(t, res.Buckets[0].DelayP95(), time.Duration(0), "scheduling delay to the handler's start")
	select {
	case m := <-alerts:
		var a jetfleetpb.Alert
		require.NoError(t, protocol.Unmarshal(m.Data, &a))
		assert.Equal(t, "degrading", a.GetType())
	case <-time.After(10 * time.Second):
		t.Fatal("no degrading alert")
	}
}

// TestJobListByState lists queued jobs from JOBS and finished runs from
// their events, and refuses an unknown state naming the field.
func TestJobListByState(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, supervisor.Config{}, nil)
	ctx := fleettest.Ctx(t, 10*time.Second)
	_, err := f.client.AddQueue(ctx, jetfleet.QueueAddRequest{Queue: "default"})
	require.NoError(t, err)
	for i := range 3 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("q-%d", i), Queue: "default", Kind: "echo", ScheduleID: "s1"})
	}
	publishRun(t, f, 100, protocol.EventSucceeded, time.Now(), time.Millisecond)
	publishRun(t, f, 101, protocol.EventDead, time.Now(), time.Millisecond)

	res, err := f.client.ListJobs(ctx, jetfleet.JobListRequest{State: jetfleet.JobQueued, Limit: 2})
	require.NoError(t, err)
	require.Len(t, res.Jobs, 2)
	assert.Equal(t, "q-0", res.Jobs[0].JobID)
	assert.Equal(t, "s1", res.Jobs[0].ScheduleID)
	require.NotZero(t, res.Next)
	res, err = f.client.ListJobs(ctx, jetfleet.JobListRequest{State: jetfleet.JobQueued, Cursor: res.Next})
	require.NoError(t, err)
	require.Len(t, res.Jobs, 1)
	assert.Equal(t, "q-2", res.Jobs[0].JobID)

	res, err = f.client.ListJobs(ctx, jetfleet.JobListRequest{State: jetfleet.JobDead})
	require.NoError(t, err)
	require.Len(t, res.Jobs, 1)
	assert.Equal(t, "run-101", res.Jobs[0].JobID)
	assert.Equal(t, protocol.ReasonMaxAttempts, res.Jobs[0].Reason)
	res, err = f.client.ListJobs(ctx, jetfleet.JobListRequest{State: jetfleet.JobSucceeded, ScheduleID: "nightly"})
	require.NoError(t, err)
	require.Len(t, res.Jobs, 1)

	_, err = f.client.ListJobs(ctx, jetfleet.JobListRequest{State: "bogus"})
	require.Error(t, err)
	assert.True(t, protocol.IsCode(err, protocol.CodeInvalidArgument))
}
