package scheduler_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestBadInputNamesTheFieldAndStoresNothing sends invalid definitions to
// the API: each error is invalid_argument naming the field, and no
// definition is stored.
func TestBadInputNamesTheFieldAndStoresNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	clk := clock.NewFake(utc("2026-06-01T10:00:00Z"))
	f.replica(scheduler.Config{}, clk)
	tests := []struct {
		name, field, doc string
	}{
		{"cron out of range", "spec.cron", `{"id":"x","spec":{"cron":"61 * * * *"},"target":{"queue":"q","kind":"k"}}`},
		{"cron with seven fields", "spec.cron", `{"id":"x","spec":{"cron":"0 0 0 1 1 * 2026"},"target":{"queue":"q","kind":"k"}}`},
		{"cron that never fires", "spec.cron", `{"id":"x","spec":{"cron":"0 0 30 2 *"},"target":{"queue":"q","kind":"k"}}`},
		{"time zone in the cron spec", "spec.cron", `{"id":"x","spec":{"cron":"TZ=Europe/Berlin 0 * * * *"},"target":{"queue":"q","kind":"k"}}`},
		{"unknown zone", "spec.zone", `{"id":"x","spec":{"cron":"@daily","zone":"Mars/Olympus"},"target":{"queue":"q","kind":"k"}}`},
		{"server-local zone", "spec.zone", `{"id":"x","spec":{"cron":"@daily","zone":"Local"},"target":{"queue":"q","kind":"k"}}`},
		{"interval below a second", "spec.interval.every", `{"id":"x","spec":{"interval":{"every":"500ms"}},"target":{"queue":"q","kind":"k"}}`},
		{"interval not a duration", "spec.interval.every", `{"id":"x","spec":{"interval":{"every":"soon"}},"target":{"queue":"q","kind":"k"}}`},
		{"phase not below the interval", "spec.interval.phase", `{"id":"x","spec":{"interval":{"every":"10s","phase":"10s"}},"target":{"queue":"q","kind":"k"}}`},
		{"no trigger", "spec", `{"id":"x","spec":{},"target":{"queue":"q","kind":"k"}}`},
		{"two triggers", "spec", `{"id":"x","spec":{"cron":"@daily","interval":{"every":"1m"}},"target":{"queue":"q","kind":"k"}}`},
		{"one-shot long past", "spec.at", `{"id":"x","spec":{"at":"2026-05-01T00:00:00Z"},"target":{"queue":"q","kind":"k"}}`},
		{"bad id", "id", `{"id":"a b","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k"}}`},
		{"id of the wrong type", "id", `{"id":5,"spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k"}}`},
		{"missing queue", "target.queue", `{"id":"x","spec":{"cron":"@daily"},"target":{"kind":"k"}}`},
		{"bad kind", "target.kind", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"a.b"}}`},
		{"negative timeout", "target.timeout", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k","timeout":"-1s"}}`},
		{"bad backoff", "target.backoff[1]", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k","backoff":["1s","later"]}}`},
		{"template syntax", "target.payload_template", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k","payload_template":"{{ .NominalTime"}}`},
		{"template field", "target.payload_template", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k","payload_template":"{{ .Nominal }}"}}`},
		{"template function", "target.payload_template", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k","payload_template":"{{ shout . }}"}}`},
		{"payload and template", "target.payload_template", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k","payload":{},"payload_template":"{}"}}`},
		{"unknown overlap policy", "policy.overlap", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k"},"policy":{"overlap":"sometimes"}}`},
		{"unknown misfire policy", "policy.misfire", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k"},"policy":{"misfire":"never"}}`},
		{"catch-up bound too high", "policy.max_catch_up", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k"},"policy":{"max_catch_up":20000}}`},
		{"end before start", "policy.end_at", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k"},"policy":{"start_at":"2027-01-02T00:00:00Z","end_at":"2027-01-01T00:00:00Z"}}`},
		{"end in the past", "policy.end_at", `{"id":"x","spec":{"cron":"@daily"},"target":{"queue":"q","kind":"k"},"policy":{"end_at":"2026-01-01T00:00:00Z"}}`},
		{"event subject with a partial wildcard", "spec.event.subject", `{"id":"x","spec":{"event":{"subject":"orders.*x"}},"target":{"queue":"q","kind":"k"}}`},
		{"event subject no stream captures", "spec.event.subject", `{"id":"x","spec":{"event":{"subject":"nowhere.at.all"}},"target":{"queue":"q","kind":"k"}}`},
		{"buffer_one on an event trigger", "policy.overlap", `{"id":"x","spec":{"event":{"subject":"events.job.*.*.dead"}},"target":{"queue":"q","kind":"k"},"policy":{"overlap":"buffer_one"}}`},
		{"dependency on itself", "spec.after.on[0].schedule_id", `{"id":"x","spec":{"after":{"on":[{"schedule_id":"x"}]}},"target":{"queue":"q","kind":"k"}}`},
		{"dependency on nothing", "spec.after.on[0]", `{"id":"x","spec":{"after":{"on":[{}]}},"target":{"queue":"q","kind":"k"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := f.nc.RequestWithContext(ctx(t, 10*time.Second), protocol.APIScheduleAdd, []byte(tt.doc))
			require.NoError(t, err)
			assert.Equal(t, "400", msg.Header.Get(micro.ErrorCodeHeader))
			var doc jetfleetpb.Error
			require.NoError(t, protocol.Unmarshal(msg.Data, &doc))
			assert.Equal(t, protocol.CodeInvalidArgument, doc.GetCode(), doc.GetMessage())
			assert.Equal(t, tt.field, doc.GetField(), doc.GetMessage())
		})
	}
	kv, err := f.js.KeyValue(ctx(t, 10*time.Second), protocol.BucketSchedules)
	require.NoError(t, err)
	_, err = kv.Get(ctx(t, 10*time.Second), "x")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound, "nothing was persisted")

	// The Go client returns the same errors as *protocol.Error.
	_, err = f.client.AddSchedule(ctx(t, 10*time.Second), &jetfleet.Schedule{ID: "y", Spec: jetfleet.Spec{Cron: "@daily"},
		Target: jetfleet.Target{Queue: "q", Kind: "k"}, Policy: jetfleet.Policy{Overlap: "sometimes"}})
	var pe *protocol.Error
	require.True(t, errors.As(err, &pe), "%v", err)
	assert.Equal(t, "policy.overlap", pe.Field)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeInvalidArgument))
}

func TestScheduleLifecycleThroughTheAPI(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	events := watchScheduleEvents(t, f.nc)
	clk := clock.NewFake(utc("2026-06-01T10:00:00Z"))
	r := f.replica(scheduler.Config{}, clk)
	waitLeading(t, r)
	c := ctx(t, 30*time.Second)

	def := &jetfleet.Schedule{ID: "report", Description: "daily report", Spec: jetfleet.Spec{Cron: "30 6 * * 1-5", Zone: "Europe/Berlin"},
		Target: jetfleet.Target{Queue: "default", Kind: "report", PayloadTemplate: `{"day":"{{.NominalTime.Format "2006-01-02"}}"}`}}
	info, err := f.client.AddSchedule(c, def)
	require.NoError(t, err)
	assert.Equal(t, utc("2026-06-01T10:00:00Z"), info.Schedule.CreatedAt)
	assert.Equal(t, utc("2026-06-02T04:30:00Z"), info.NextFires[0].UTC(), "06:30 CEST on the next weekday")
	_, err = f.client.AddSchedule(c, def)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeAlreadyExists))

	// Preview of the stored schedule and of a definition not stored.
	prev, err := f.client.PreviewSchedule(c, jetfleet.PreviewRequest{ID: "report", Count: 3})
	require.NoError(t, err)
	assert.Equal(t, "Europe/Berlin", prev.Zone)
	require.Len(t, prev.Times, 3)
	assert.Equal(t, "2026-06-02T06:30:00+02:00", prev.Times[0].Format(time.RFC3339))
	assert.Equal(t, "2026-06-04T06:30:00+02:00", prev.Times[2].Format(time.RFC3339))
	prev, err = f.client.PreviewSchedule(c, jetfleet.PreviewRequest{Schedule: interval("p", time.Hour, "k"), From: utc("2026-01-01T00:30:00Z"), Count: 2})
	require.NoError(t, err)
	assert.Equal(t, []time.Time{utc("2026-01-01T01:00:00Z"), utc("2026-01-01T02:00:00Z")}, []time.Time{prev.Times[0].UTC(), prev.Times[1].UTC()})

	// Update: a new spec takes effect from now; a stale revision conflicts.
	def.Spec.Cron = "0 7 * * *"
	_, err = f.client.UpdateSchedule(c, def, info.Revision+5)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeConflict))
	info, err = f.client.UpdateSchedule(c, def, info.Revision)
	require.NoError(t, err)
	assert.Equal(t, utc("2026-06-02T05:00:00Z"), info.NextFires[0].UTC())

	// Pause with a note, list, resume.
	info, err = f.client.PauseSchedule(c, "report", "holiday freeze")
	require.NoError(t, err)
	assert.True(t, info.Schedule.Paused)
	assert.Empty(t, info.NextFires)
	_, err = f.client.AddSchedule(c, interval("other", time.Minute, "k"))
	require.NoError(t, err)
	list, err := f.client.ListSchedules(c, jetfleet.ScheduleListRequest{Limit: 1})
	require.NoError(t, err)
	require.Len(t, list.Schedules, 1)
	assert.Equal(t, "other", list.Schedules[0].ID)
	assert.Equal(t, "every 60s", list.Schedules[0].Trigger)
	list, err = f.client.ListSchedules(c, jetfleet.ScheduleListRequest{After: list.Next})
	require.NoError(t, err)
	require.Len(t, list.Schedules, 1)
	assert.Equal(t, "report", list.Schedules[0].ID)
	assert.True(t, list.Schedules[0].Paused)
	assert.Equal(t, "cron 0 7 * * * (Europe/Berlin)", list.Schedules[0].Trigger)
	assert.Empty(t, list.Next)
	_, err = f.client.ResumeSchedule(c, "report")
	require.NoError(t, err)
	paused := events.waitN(t, "report", protocol.EventPaused, 1)
	assert.Equal(t, "holiday freeze", paused[0].GetReason())
	events.waitN(t, "report", protocol.EventResumed, 1)

	// Trigger fires now; the template sees the nominal time.
	res, err := f.client.TriggerSchedule(c, "report")
	require.NoError(t, err)
	assert.Equal(t, "fired", res.Outcome)
	msgs := f.jobMessages(t)
	require.Len(t, msgs, 1)
	assert.Equal(t, res.JobID, msgs[0].id)
	assert.JSONEq(t, `{"day":"2026-06-01"}`, string(msgs[0].data))

	// A refused add of the live id leaves its state alone.
	f.waitState(t, "report", func(st map[string]any) bool { return st["last_fire"] != nil })
	stRev, stDoc := f.stateOf(t, "report")
	_, err = f.client.AddSchedule(c, def)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeAlreadyExists))
	gotRev, gotDoc := f.stateOf(t, "report")
	assert.Equal(t, stRev, gotRev, "the state was not purged or written")
	assert.JSONEq(t, string(stDoc), string(gotDoc))
	info, err = f.client.GetSchedule(c, "report")
	require.NoError(t, err)
	require.NotNil(t, info.State)
	assert.Equal(t, res.JobID, info.State.LastFire.JobID)
	assert.Equal(t, uint64(1), info.State.Fires)

	// Remove: gone, with its state.
	require.NoError(t, f.client.RemoveSchedule(c, "report"))
	_, err = f.client.GetSchedule(c, "report")
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
	events.waitN(t, "report", protocol.EventDeleted, 1)
	events.waitN(t, "report", protocol.EventCreated, 1)
	events.waitN(t, "report", protocol.EventUpdated, 1)
}

func TestAPIIsADiscoverableMicroService(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	f.replica(scheduler.Config{}, clock.Real())
	subject, err := micro.ControlSubject(micro.InfoVerb, protocol.SchedulerService, "")
	require.NoError(t, err)
	msg, err := f.nc.RequestWithContext(ctx(t, 10*time.Second), subject, nil)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(msg.Data, &info))
	assert.Equal(t, protocol.SchedulerService, info.Name)
	var subjects []string
	for _, ep := range info.Endpoints {
		subjects = append(subjects, ep.Subject)
	}
	for _, ep := range []string{"add", "update", "get", "ls", "rm", "pause", "resume", "trigger", "preview", "backfill"} {
		assert.Contains(t, subjects, "jetfleet.api.scheduler."+ep)
	}
}

func TestBackfillFiresAPastRangeOnce(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	clk := clock.NewFake(utc("2026-06-01T12:00:00Z"))
	r := f.replica(scheduler.Config{}, clk)
	waitLeading(t, r)
	c := ctx(t, 30*time.Second)
	def := &jetfleet.Schedule{ID: "hourly", Spec: jetfleet.Spec{Cron: "@hourly"}, Target: jetfleet.Target{Queue: "default", Kind: "k"},
		Policy: jetfleet.Policy{Overlap: jetfleet.OverlapSkip}}
	_, err := f.client.AddSchedule(c, def)
	require.NoError(t, err)

	res, err := f.client.BackfillSchedule(c, "hourly", utc("2026-06-01T08:00:00Z"), utc("2026-06-01T11:00:00Z"), 0)
	require.NoError(t, err)
	assert.Equal(t, 4, res.Fired, "08:00 to 11:00 inclusive, regardless of overlap")
	assert.Equal(t, 0, res.Duplicates)
	res, err = f.client.BackfillSchedule(c, "hourly", utc("2026-06-01T10:00:00Z"), utc("2026-06-01T11:30:00Z"), 0)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.BackfillResponse{Fired: 2, Duplicates: 2, First: utc("2026-06-01T10:00:00Z"), Last: utc("2026-06-01T11:00:00Z")},
		jetfleet.BackfillResponse{Fired: res.Fired, Duplicates: res.Duplicates, First: res.First.UTC(), Last: res.Last.UTC()})
	res, err = f.client.BackfillSchedule(c, "hourly", utc("2026-06-01T00:00:00Z"), utc("2026-06-01T11:00:00Z"), 3)
	require.NoError(t, err)
	assert.True(t, res.Truncated)
	assert.Equal(t, 3, res.Fired)

	ids := map[string]int{}
	for _, m := range f.jobMessages(t) {
		ids[m.id]++
	}
	assert.Len(t, ids, 7, "00:00, 01:00, 02:00 and 08:00 to 11:00")
	for id, n := range ids {
		assert.Equal(t, 1, n, id)
	}
	_, err = f.client.BackfillSchedule(c, "hourly", utc("2026-06-01T10:00:00Z"), utc("2026-06-02T10:00:00Z"), 0)
	var pe *protocol.Error
	require.True(t, errors.As(err, &pe))
	assert.Equal(t, "to", pe.Field)
}

// TestFollowersForwardLeaderRequests sends trigger to every replica: the
// followers forward it to the leader, which fires.
func TestFollowersForwardLeaderRequests(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	clk := clock.NewFake(utc("2026-06-01T12:00:00Z"))
	rs := []*replica{f.replica(scheduler.Config{}, clk), f.replica(scheduler.Config{}, clk), f.replica(scheduler.Config{}, clk)}
	leaderOf(t, rs...)
	c := ctx(t, 30*time.Second)
	_, err := f.client.AddSchedule(c, interval("manual", time.Hour, "k"))
	require.NoError(t, err)
	for _, r := range rs {
		require.NoError(t, r.WaitSynced(c))
	}
	for range 6 { // the queue group spreads requests over the replicas
		res, err := f.client.TriggerSchedule(c, "manual")
		require.NoError(t, err)
		assert.Equal(t, "fired", res.Outcome)
	}
	assert.Len(t, f.jobMessages(t), 6)
	_, err = f.client.TriggerSchedule(c, "nope")
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
}
