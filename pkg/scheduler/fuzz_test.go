package scheduler

import (
	"testing"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

var fuzzZones = []string{"", "UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata",
	"Pacific/Apia", "America/Sao_Paulo", "Pacific/Chatham"}

// FuzzCronSpec feeds arbitrary specs and zones to the parser. A spec that
// compiles must yield strictly increasing fire times, and next must be a
// step function: asking from any instant between two fires returns the
// later one.
func FuzzCronSpec(f *testing.F) {
	for _, s := range []string{"0 * * * *", "30 2 * * *", "*/15 * * * *", "0 0 29 2 *", "@daily", "@every 90s",
		"5 4 * * sun", "0 0,30 1-3 * * *", "0 0 1,15 * 1-5", "@hourly", "61 * * * *", "TZ=UTC @daily"} {
		f.Add(s, uint8(2), int64(1774742400))
	}
	f.Fuzz(func(t *testing.T, spec string, zone uint8, from int64) {
		if from < 0 || from > 4102444800 { // 1970 to 2100
			return
		}
		c, err := compile(&jetfleet.Schedule{ID: "f", Spec: jetfleet.Spec{Cron: spec, Zone: fuzzZones[int(zone)%len(fuzzZones)]},
			Target: jetfleet.Target{Queue: "q", Kind: "k"}})
		if err != nil {
			return
		}
		prev := from
		for range 8 {
			next, ok := c.nextNominal(prev)
			if !ok {
				return
			}
			if next <= prev {
				t.Fatalf("%q: next(%d) = %d is not later", spec, prev, next)
			}
			if mid := prev + (next-prev)/2; mid > prev {
				if again, ok := c.nextNominal(mid); !ok || again != next {
					t.Fatalf("%q in %s: next(%d) = %d but next(%d) = %d", spec, c.loc, prev, next, mid, again)
				}
			}
			prev = next
		}
	})
}

// FuzzScheduleDocument feeds arbitrary JSON to the definition decoder and
// validator: no panic, and errors are field errors.
func FuzzScheduleDocument(f *testing.F) {
	f.Add([]byte(`{"id":"x","spec":{"cron":"@daily","zone":"Europe/Berlin"},"target":{"queue":"q","kind":"k","timeout":"30s"},"policy":{"overlap":"skip"}}`))
	f.Add([]byte(`{"id":"x","spec":{"interval":{"every":"10s","phase":"2s"}},"target":{"queue":"q","kind":"k","payload_template":"{{.JobID}}"}}`))
	f.Add([]byte(`{"id":"x","spec":{"after":{"on":[{"schedule_id":"a"},{"kind":"b"}]}},"target":{"queue":"q","kind":"k"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		def, err := jetfleet.DecodeSchedule(data)
		if err != nil {
			return
		}
		if err := Validate(def); err != nil {
			return
		}
		c, _ := compile(def)
		if c.kind == kindTime {
			c.nextNominal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix())
		}
	})
}
