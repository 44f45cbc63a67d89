package scheduler_test

import (
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

func TestFiresOnTheFakeClock(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	events := watchScheduleEvents(t, f.nc)
	clk := clock.NewFake(utc("2026-06-01T09:59:50Z"))
	r := f.replica(scheduler.Config{}, clk)
	waitLeading(t, r)

	def := interval("tick", 10*time.Second, "echo")
	def.Target.Payload = []byte(`{"hello":"world"}`)
	def.Target.Timeout = jetfleet.Duration(90 * time.Second)
	def.Target.MaxAttempts = 3
	def.Target.Backoff = []jetfleet.Duration{jetfleet.Duration(time.Second), jetfleet.Duration(10 * time.Second)}
	_, err := f.client.AddSchedule(ctx(t, 10*time.Second), def)
	require.NoError(t, err)
	require.NoError(t, r.WaitSynced(ctx(t, 10*time.Second)))

	clk.Set(utc("2026-06-01T10:00:00Z"))
	require.NoError(t, r.Kick(ctx(t, 10*time.Second)))
	clk.Set(utc("2026-06-01T10:00:10Z"))
	require.NoError(t, r.Kick(ctx(t, 10*time.Second)))
	fired := events.waitN(t, "tick", protocol.EventFired, 2)
	assert.Equal(t, []time.Time{utc("2026-06-01T10:00:00Z"), utc("2026-06-01T10:00:10Z")}, nominalTimes(fired))

	msgs := f.jobMessages(t)
	require.Len(t, msgs, 2)
	m := msgs[0]
	assert.Equal(t, "sched.tick.1780308000", m.id)
	assert.Equal(t, m.id, m.header.Get(protocol.HeaderMsgID))
	assert.Equal(t, "jobs.default.echo", m.subject)
	assert.Equal(t, `{"hello":"world"}`, string(m.data))
	assert.Equal(t, "1m30s", m.header.Get(protocol.HeaderTimeout))
	assert.Equal(t, "3", m.header.Get(protocol.HeaderMaxAttempts))
	assert.Equal(t, "1s,10s", m.header.Get(protocol.HeaderBackoff))
	assert.Equal(t, "tick", m.header.Get(protocol.HeaderScheduleID))
	assert.Equal(t, "2026-06-01T10:00:00Z", m.header.Get(protocol.HeaderNominalTime))
	assert.NotEmpty(t, m.header.Get(protocol.HeaderTraceParent), "the fire's trace context travels with the job")
	assert.Equal(t, fired[0].GetTraceId(), traceIDOf(m.header.Get(protocol.HeaderTraceParent)))

	info, err := f.client.GetSchedule(ctx(t, 10*time.Second), "tick")
	require.NoError(t, err)
	require.NotNil(t, info.State)
	assert.Equal(t, utc("2026-06-01T10:00:10Z"), info.State.LastNominal)
	assert.Equal(t, uint64(2), info.State.Fires)
	assert.Equal(t, "sched.tick.1780308010", info.State.LastFire.JobID)
	assert.Equal(t, utc("2026-06-01T10:00:20Z"), info.NextFires[0].UTC())

	var spans int
	for _, s := range r.env.Spans.GetSpans() {
		if s.Name == "scheduler.fire" {
			spans++
		}
	}
	assert.Equal(t, 2, spans, "each fire starts a scheduler.fire span")
}

// traceIDOf reads the trace id of a W3C traceparent.
func traceIDOf(traceparent string) string {
	if len(traceparent) < 35 {
		return ""
	}
	return traceparent[3:35]
}
