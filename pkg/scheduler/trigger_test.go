package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// fires returns the first n fire instants strictly after from.
func fires(t *testing.T, cronSpec, zone string, from time.Time, n int) []time.Time {
	t.Helper()
	c, err := compile(&jetfleet.Schedule{ID: "dst", Spec: jetfleet.Spec{Cron: cronSpec, Zone: zone}, Target: jetfleet.Target{Queue: "q", Kind: "k"}})
	require.NoError(t, err)
	var out []time.Time
	after := from.Unix()
	for range n {
		next, ok := c.nextNominal(after)
		require.True(t, ok)
		out = append(out, time.Unix(next, 0).UTC())
		after = next
	}
	return out
}

// TestDSTPolicy is the documented DST policy (docs/scheduling.md) as a
// table: a civil time in a spring-forward gap fires once, shifted forward by
// the gap; a civil time repeated by a fall-back fires once, at its first
// occurrence; civil times that land on one instant fire once.
func TestDSTPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, zone, cron string
		from             string
		want             []string // UTC instants
	}{
		// Europe/Berlin: 2026-03-29 02:00 CET → 03:00 CEST; 2026-10-25 03:00 CEST → 02:00 CET.
		{"Berlin daily in the spring gap", "Europe/Berlin", "30 2 * * *", "2026-03-27T12:00:00Z",
			[]string{"2026-03-28T01:30:00Z", "2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"}},
		{"Berlin daily in the repeated hour", "Europe/Berlin", "30 2 * * *", "2026-10-23T12:00:00Z",
			[]string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"Berlin hourly across spring forward", "Europe/Berlin", "0 * * * *", "2026-03-28T22:30:00Z",
			[]string{"2026-03-28T23:00:00Z", "2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z"}},
		{"Berlin hourly across fall back", "Europe/Berlin", "0 * * * *", "2026-10-24T21:30:00Z",
			[]string{"2026-10-24T22:00:00Z", "2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"}},
		{"Berlin two gap times both fire", "Europe/Berlin", "0,20 2 * * *", "2026-03-28T12:00:00Z",
			[]string{"2026-03-29T01:00:00Z", "2026-03-29T01:20:00Z", "2026-03-30T00:00:00Z"}},
		{"Berlin six-field spec in the gap", "Europe/Berlin", "30 30 2 * * *", "2026-03-28T12:00:00Z",
			[]string{"2026-03-29T01:30:30Z", "2026-03-30T00:30:30Z"}},

		// America/New_York: 2026-03-08 02:00 EST → 03:00 EDT; 2026-11-01 02:00 EDT → 01:00 EST.
		{"New York daily in the spring gap", "America/New_York", "30 2 * * *", "2026-03-06T12:00:00Z",
			[]string{"2026-03-07T07:30:00Z", "2026-03-08T07:30:00Z", "2026-03-09T06:30:00Z"}},
		{"New York daily in the repeated hour", "America/New_York", "30 1 * * *", "2026-10-30T12:00:00Z",
			[]string{"2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		{"New York hourly across spring forward", "America/New_York", "0 * * * *", "2026-03-08T04:30:00Z",
			[]string{"2026-03-08T05:00:00Z", "2026-03-08T06:00:00Z", "2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z"}},
		{"New York hourly across fall back", "America/New_York", "0 * * * *", "2026-11-01T03:30:00Z",
			[]string{"2026-11-01T04:00:00Z", "2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"}},
		{"New York every 15 minutes across spring forward", "America/New_York", "*/15 * * * *", "2026-03-08T06:40:00Z",
			[]string{"2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z", "2026-03-08T07:30:00Z"}},

		// Australia/Lord_Howe, a 30-minute DST: 2026-04-05 02:00 (+11) → 01:30 (+10:30);
		// 2026-10-04 02:00 (+10:30) → 02:30 (+11).
		{"Lord Howe daily in the spring gap", "Australia/Lord_Howe", "15 2 * * *", "2026-10-02T00:00:00Z",
			[]string{"2026-10-02T15:45:00Z", "2026-10-03T15:45:00Z", "2026-10-04T15:15:00Z"}},
		{"Lord Howe daily in the repeated half hour", "Australia/Lord_Howe", "45 1 * * *", "2026-04-03T00:00:00Z",
			[]string{"2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"}},
		{"Lord Howe hourly across spring forward", "Australia/Lord_Howe", "0 * * * *", "2026-10-03T14:00:00Z",
			[]string{"2026-10-03T14:30:00Z", "2026-10-03T15:30:00Z", "2026-10-03T16:00:00Z", "2026-10-03T17:00:00Z"}},
		{"Lord Howe hourly across fall back", "Australia/Lord_Howe", "0 * * * *", "2026-04-04T12:30:00Z",
			[]string{"2026-04-04T13:00:00Z", "2026-04-04T14:00:00Z", "2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z"}},
		{"Lord Howe half past across fall back", "Australia/Lord_Howe", "30 * * * *", "2026-04-04T13:00:00Z",
			[]string{"2026-04-04T13:30:00Z", "2026-04-04T14:30:00Z", "2026-04-04T16:00:00Z", "2026-04-04T17:00:00Z"}},

		// Asia/Kolkata: +05:30 all year; the same dates change nothing.
		{"Kolkata daily on Berlin's spring date", "Asia/Kolkata", "30 2 * * *", "2026-03-27T12:00:00Z",
			[]string{"2026-03-27T21:00:00Z", "2026-03-28T21:00:00Z", "2026-03-29T21:00:00Z"}},
		{"Kolkata daily on New York's fall date", "Asia/Kolkata", "30 1 * * *", "2026-10-30T12:00:00Z",
			[]string{"2026-10-30T20:00:00Z", "2026-10-31T20:00:00Z", "2026-11-01T20:00:00Z"}},
		{"Kolkata hourly across Berlin's spring forward", "Asia/Kolkata", "0 * * * *", "2026-03-28T23:00:00Z",
			[]string{"2026-03-28T23:30:00Z", "2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z", "2026-03-29T02:30:00Z"}},
		{"Kolkata hourly across New York's fall back", "Asia/Kolkata", "0 * * * *", "2026-11-01T04:00:00Z",
			[]string{"2026-11-01T04:30:00Z", "2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var want []time.Time
			for _, s := range tt.want {
				want = append(want, utc(s))
			}
			assert.Equal(t, want, fires(t, tt.cron, tt.zone, utc(tt.from), len(want)))
		})
	}
}

func TestIntervalTrigger(t *testing.T) {
	t.Parallel()
	anchor := utc("2026-01-01T00:00:07Z")
	c, err := compile(&jetfleet.Schedule{ID: "iv", Spec: jetfleet.Spec{Interval: &jetfleet.Interval{Every: jetfleet.Duration(10 * time.Second), Phase: jetfleet.Duration(2 * time.Second), Anchor: anchor}},
		Target: jetfleet.Target{Queue: "q", Kind: "k"}})
	require.NoError(t, err)
	next, ok := c.nextNominal(utc("2026-01-01T00:00:09Z").Unix())
	require.True(t, ok)
	assert.Equal(t, utc("2026-01-01T00:00:19Z"), time.Unix(next, 0).UTC(), "anchor + phase + k·every")
	next, _ = c.nextNominal(utc("2025-12-31T23:59:59Z").Unix())
	assert.Equal(t, utc("2026-01-01T00:00:09Z"), time.Unix(next, 0).UTC(), "before the anchor too")

	every, err := compile(&jetfleet.Schedule{ID: "ev", Spec: jetfleet.Spec{Cron: "@every 1h"}, Target: jetfleet.Target{Queue: "q", Kind: "k"}})
	require.NoError(t, err)
	next, _ = every.nextNominal(utc("2026-03-29T01:30:00Z").Unix())
	assert.Equal(t, utc("2026-03-29T02:00:00Z"), time.Unix(next, 0).UTC(), "@every is epoch-aligned and ignores DST")
}

func TestBounds(t *testing.T) {
	t.Parallel()
	c, err := compile(&jetfleet.Schedule{ID: "b", Spec: jetfleet.Spec{Cron: "@hourly"}, Target: jetfleet.Target{Queue: "q", Kind: "k"},
		Policy: jetfleet.Policy{StartAt: utc("2026-01-01T10:30:00Z"), EndAt: utc("2026-01-01T12:00:00Z")}})
	require.NoError(t, err)
	var got []time.Time
	for after := int64(0); ; {
		next, ok := c.nextNominal(after)
		if !ok {
			break
		}
		got = append(got, time.Unix(next, 0).UTC())
		after = next
	}
	assert.Equal(t, []time.Time{utc("2026-01-01T11:00:00Z"), utc("2026-01-01T12:00:00Z")}, got)

	once, err := compile(&jetfleet.Schedule{ID: "o", Spec: jetfleet.Spec{At: new(utc("2026-05-01T08:00:00Z"))}, Target: jetfleet.Target{Queue: "q", Kind: "k"}})
	require.NoError(t, err)
	next, ok := once.nextNominal(0)
	assert.True(t, ok)
	assert.Equal(t, utc("2026-05-01T08:00:00Z").Unix(), next)
	_, ok = once.nextNominal(next)
	assert.False(t, ok)
}
