package protocol_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// TestUniqueReleasedBy: a key held until finished is released by every end
// of a run, a period key by the failures only; nothing else releases.
func TestUniqueReleasedBy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		until, event string
		want         bool
	}{
		{protocol.UniqueUntilFinished, protocol.EventSucceeded, true},
		{protocol.UniqueUntilFinished, protocol.EventDead, true},
		{protocol.UniqueUntilFinished, protocol.EventCancelled, true},
		{protocol.UniqueUntilFinished, protocol.EventRetrying, false},
		{protocol.UniqueUntilFinished, protocol.EventFailed, false},
		{protocol.UniqueUntilPeriod, protocol.EventSucceeded, false},
		{protocol.UniqueUntilPeriod, protocol.EventDead, true},
		{protocol.UniqueUntilPeriod, protocol.EventCancelled, true},
		{"", protocol.EventSucceeded, true},
	} {
		assert.Equal(t, c.want, protocol.UniqueReleasedBy(c.until, c.event), "%s on %s", c.until, c.event)
	}
}

// TestUniqueKeysAndTTL: keys are valid bucket keys whatever the unique
// key's bytes; a backstop counts from when the job is due.
func TestUniqueKeysAndTTL(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "key.default.report.YWNtZQ", protocol.UniqueClaimKey("default", "report", "acme"))
	assert.Equal(t, "key.q.k.YS5iIGMvZD4qPvCfmIA", protocol.UniqueClaimKey("q", "k", "a.b c/d>*>😀"))
	assert.Equal(t, "job.b64_c2NoZWQ6eDox", protocol.UniqueJobKey("sched:x:1"))

	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	assert.Equal(t, time.Hour, protocol.Unique{Key: "k", For: time.Hour}.TTL(now, time.Time{}))
	assert.Equal(t, protocol.DefaultUniqueBackstop, protocol.Unique{Key: "k", UntilFinished: true}.TTL(now, time.Time{}))
	assert.Equal(t, 3*time.Hour, protocol.Unique{Key: "k", For: time.Hour, UntilFinished: true}.TTL(now, now.Add(2*time.Hour)))

	h, err := protocol.ParseUniqueHold(protocol.MarshalUniqueHold(protocol.UniqueHold{Key: "key.q.k.YQ", Until: "period"}))
	require.NoError(t, err)
	assert.Equal(t, protocol.UniqueHold{Key: "key.q.k.YQ", Until: "period"}, h)
	_, err = protocol.ParseUniqueHold([]byte(`{}`))
	assert.Error(t, err)
}
