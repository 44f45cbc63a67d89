package scheduler_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestEventTriggerFiresPerStoredMessage publishes real messages to a
// stream: each one fires a job, its payload passed through or mapped by a
// template; messages stored before the schedule existed do not fire.
func TestEventTriggerFiresPerStoredMessage(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	c := ctx(t, 30*time.Second)
	_, err := f.js.CreateStream(c, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	require.NoError(t, err)
	events := watchScheduleEvents(t, f.nc)
	r := f.replica(scheduler.Config{}, clock.Real())
	waitLeading(t, r)
	_, err = f.js.Publish(c, "orders.created", []byte(`{"id":0}`)) // before the schedules: never fires
	require.NoError(t, err)

	pass := &jetfleet.Schedule{ID: "on-order", Spec: jetfleet.Spec{Event: &jetfleet.EventSpec{Subject: "orders.created"}},
		Target: jetfleet.Target{Queue: "default", Kind: "process"}}
	info, err := f.client.AddSchedule(c, pass)
	require.NoError(t, err)
	assert.Equal(t, "ORDERS", info.Schedule.Spec.Event.Stream, "the stream is found from the subject")
	mapped := &jetfleet.Schedule{ID: "on-order-mapped", Spec: jetfleet.Spec{Event: &jetfleet.EventSpec{Subject: "orders.*"}},
		Target: jetfleet.Target{Queue: "default", Kind: "notify",
			PayloadTemplate: `{"order":{{json .Event.JSON.id}},"subject":"{{.Event.Subject}}","schedule":"{{.ScheduleID}}"}`}}
	_, err = f.client.AddSchedule(c, mapped)
	require.NoError(t, err)
	require.NoError(t, r.WaitSynced(c))

	for i := 1; i <= 3; i++ {
		_, err := f.js.Publish(c, "orders.created", []byte(`{"id":`+itoa(int64(i))+`}`))
		require.NoError(t, err)
	}
	_, err = f.js.Publish(c, "orders.cancelled", []byte(`{"id":9}`))
	require.NoError(t, err)
	events.waitN(t, "on-order", protocol.EventFired, 3)
	events.waitN(t, "on-order-mapped", protocol.EventFired, 4)

	payloads := map[string][]string{}
	for _, m := range f.jobMessages(t) {
		payloads[m.subject] = append(payloads[m.subject], string(m.data))
	}
	assert.Equal(t, []string{`{"id":1}`, `{"id":2}`, `{"id":3}`}, payloads["jobs.default.process"])
	require.Len(t, payloads["jobs.default.notify"], 4)
	assert.JSONEq(t, `{"order":1,"subject":"orders.created","schedule":"on-order-mapped"}`, payloads["jobs.default.notify"][0])
	assert.JSONEq(t, `{"order":9,"subject":"orders.cancelled","schedule":"on-order-mapped"}`, payloads["jobs.default.notify"][3])

	// The cursor survives a new leader: nothing fires twice, nothing is lost.
	r.stop()
	next := f.replica(scheduler.Config{}, clock.Real())
	waitLeading(t, next)
	_, err = f.js.Publish(c, "orders.created", []byte(`{"id":4}`))
	require.NoError(t, err)
	events.waitN(t, "on-order", protocol.EventFired, 4)
	events.waitN(t, "on-order-mapped", protocol.EventFired, 5) // orders.* sees it too
	count := map[string]int{}
	for _, m := range f.jobMessages(t) {
		count[m.id]++
	}
	for id, n := range count {
		assert.Equal(t, 1, n, id)
	}
	assert.Len(t, count, 9)
}

// TestDependencyTriggers: "report" fires once both "extract" and "load"
// succeeded for the same nominal time (fan-in); "audit" fires after every
// succeeded job of kind extract, scheduled or not. The jobs run on a real
// runner that publishes the events.
func TestDependencyTriggers(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	events := watchScheduleEvents(t, f.nc)
	jobs := watchJobEvents(t, f.nc)
	base := utc("2026-06-01T10:00:00Z")
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	// load fails for the 20s run: report must not fire for it.
	f.runner("etl", func(_ context.Context, job protocol.Job) error {
		if job.Kind == "load" && job.NominalTime.Equal(at(20)) {
			return errHandler
		}
		return nil
	})
	clk := clock.NewFake(base)
	r := f.replica(scheduler.Config{}, clk)
	waitLeading(t, r)
	c := ctx(t, 30*time.Second)
	for _, def := range []*jetfleet.Schedule{
		{ID: "extract", Spec: jetfleet.Spec{Interval: &jetfleet.Interval{Every: jetfleet.Duration(10 * time.Second)}}, Target: jetfleet.Target{Queue: "etl", Kind: "extract"}},
		{ID: "load", Spec: jetfleet.Spec{Interval: &jetfleet.Interval{Every: jetfleet.Duration(10 * time.Second)}}, Target: jetfleet.Target{Queue: "etl", Kind: "load"}},
		{ID: "report", Spec: jetfleet.Spec{After: &jetfleet.Dependency{On: []jetfleet.Upstream{{ScheduleID: "extract"}, {ScheduleID: "load"}}}},
			Target: jetfleet.Target{Queue: "reports", Kind: "report", PayloadTemplate: `{"for":"{{rfc3339 .NominalTime}}","after":"{{.Upstream.JobID}}"}`}},
		{ID: "audit", Spec: jetfleet.Spec{After: &jetfleet.Dependency{On: []jetfleet.Upstream{{Kind: "extract"}}}},
			Target: jetfleet.Target{Queue: "reports", Kind: "audit"}},
	} {
		_, err := f.client.AddSchedule(c, def)
		require.NoError(t, err)
	}
	require.NoError(t, r.WaitSynced(c))

	for _, s := range []int{10, 20, 30} {
		clk.Set(at(s))
		require.NoError(t, r.Kick(c))
		jobs.waitFor(t, "sched.extract."+itoa(at(s).Unix()), protocol.EventSucceeded)
		// Both upstream runs of this nominal time end before the clock moves
		// on: on a loaded machine a later tick could otherwise judge report's
		// run before load's outcome is in.
		loadOutcome := protocol.EventSucceeded
		if s == 20 {
			loadOutcome = protocol.EventDead
		}
		jobs.waitFor(t, "sched.load."+itoa(at(s).Unix()), loadOutcome)
	}
	fired := events.waitN(t, "report", protocol.EventFired, 2)
	assert.Equal(t, []time.Time{at(10), at(30)}, nominalTimes(fired), "the 20s run of load failed: no report for it")
	assert.Equal(t, "sched.report."+itoa(at(10).Unix()), fired[0].GetJobId())

	// A job of kind extract published by hand has no nominal time: audit
	// fires for it too, with an id from the event's sequence.
	msg, err := protocol.Job{ID: "manual-extract", Queue: "etl", Kind: "extract", Payload: []byte(`{}`)}.Msg()
	require.NoError(t, err)
	_, err = f.js.PublishMsg(c, msg)
	require.NoError(t, err)
	audit := events.waitN(t, "audit", protocol.EventFired, 4)
	assert.Equal(t, []time.Time{at(10), at(20), at(30)}, nominalTimes(audit[:3]))

	var report map[string]string
	for _, m := range f.jobMessages(t) {
		if m.id == "sched.report."+itoa(at(30).Unix()) {
			require.NoError(t, json.Unmarshal(m.data, &report))
		}
	}
	assert.Equal(t, "2026-06-01T10:00:30Z", report["for"])
	assert.Contains(t, []string{"sched.extract." + itoa(at(30).Unix()), "sched.load." + itoa(at(30).Unix())}, report["after"])
}
