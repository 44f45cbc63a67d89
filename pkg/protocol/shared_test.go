package protocol_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

func TestParseEventSubject(t *testing.T) {
	t.Parallel()
	for subject, want := range map[string]protocol.EventSubject{
		"events.job.default.echo.succeeded.j-1": {Of: "job", Queue: "default", Kind: "echo", Type: "succeeded", JobToken: "j-1"},
		"events.schedule.nightly.fired":         {Of: "schedule", ScheduleID: "nightly", Type: "fired"},
		"events.queue.default.breaker_opened":   {Of: "queue", Queue: "default", Type: "breaker_opened"},
	} {
		got, ok := protocol.ParseEventSubject(subject)
		assert.True(t, ok, subject)
		assert.Equal(t, want, got, subject)
	}
	for _, subject := range []string{"events.batch.agent-1", "events.job.default.echo.succeeded", "jobs.default.echo", "events"} {
		_, ok := protocol.ParseEventSubject(subject)
		assert.False(t, ok, subject)
	}
}

func TestJobSubjectTokens(t *testing.T) {
	t.Parallel()
	for subject, want := range map[string][2]string{
		"jobs.default.echo":   {"default", "echo"},
		"jobs.default":        {"default", "_invalid"},
		"jobs.default.a.b":    {"default", "_invalid"},
		"jobs.bad queue.echo": {"_invalid", "echo"},
	} {
		q, k := protocol.JobSubjectTokens(subject)
		assert.Equal(t, want, [2]string{q, k}, subject)
	}
}

func TestRegistrationFreshness(t *testing.T) {
	t.Parallel()
	newest := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	hb := func(interval time.Duration, draining bool) *jetfleetpb.Heartbeat {
		return &jetfleetpb.Heartbeat{Interval: durationpb.New(interval), Draining: draining}
	}
	assert.True(t, protocol.RegistrationLive(hb(time.Second, false), newest.Add(-3*time.Second), newest))
	assert.False(t, protocol.RegistrationLive(hb(time.Second, false), newest.Add(-3*time.Second-time.Millisecond), newest))
	assert.True(t, protocol.RegistrationFresh(hb(100*time.Millisecond, false), newest.Add(-3*time.Second), newest),
		"an interval under 1s counts as 1s")
	assert.True(t, protocol.RegistrationLive(hb(10*time.Second, false), newest.Add(-29*time.Second), newest))
	assert.False(t, protocol.RegistrationLive(hb(time.Second, true), newest, newest), "a draining agent is fresh, not live")
	assert.True(t, protocol.RegistrationFresh(hb(time.Second, true), newest, newest))
}

func TestNewDeadLetter(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	dl := protocol.NewDeadLetter(protocol.Job{}, "jobs.default", nats.Header{"X": {"y"}}, []byte("p"), 42, at)
	assert.Equal(t, "JOBS-42", dl.GetJobId())
	assert.Equal(t, "default", dl.GetQueue())
	assert.Equal(t, "_invalid", dl.GetKind())
	assert.Equal(t, uint64(42), dl.GetOriginalSequence())
	assert.Equal(t, "jobs.default", dl.GetOriginalSubject())
	assert.Equal(t, []string{"y"}, dl.GetHeaders()["X"].GetValues())
	assert.Equal(t, at, dl.GetFailedAt().AsTime())
	msg, err := protocol.DeadLetterMsg(dl)
	assert.NoError(t, err)
	assert.Equal(t, "dlq.default._invalid", msg.Subject)
	assert.Equal(t, "dlq:JOBS:42", msg.Header.Get(protocol.HeaderMsgID))
}
