// Package workload holds what jetfleet's benchmarks feed the fleet, so that
// `jetfleet bench` (package bench) and the go test benchmarks of the
// component packages measure the same thing: the job payload and the mix of
// idle schedules. It imports nothing of jetfleet, so that any package's
// tests can use it.
package workload

import (
	"fmt"
	"strings"
	"time"
)

// DefaultPayloadSize is the size of the benchmarks' job payload.
const DefaultPayloadSize = 100

// payloadHead and payloadTail frame the padding of a payload: a small JSON
// document such as a web application enqueues (a welcome e-mail).
const (
	payloadHead = `{"id":12345,"email":"someone@example.com","template":"welcome","locale":"en","x":"`
	payloadTail = `"}`
	padding     = "0123456789abcdefghijklmnopqrstuvwxyz"
)

// Payload returns a JSON object of exactly size bytes (at least 8): the
// benchmark job's body.
func Payload(size int) []byte {
	head := payloadHead
	if size < len(head)+len(payloadTail) {
		head = `{"x":"`
	}
	n := max(size-len(head)-len(payloadTail), 0)
	var b strings.Builder
	b.Grow(len(head) + n + len(payloadTail))
	b.WriteString(head)
	for b.Len() < len(head)+n {
		b.WriteString(padding[:min(len(padding), len(head)+n-b.Len())])
	}
	b.WriteString(payloadTail)
	return []byte(b.String())
}

// IdleZones are the time zones of the idle cron schedules.
var IdleZones = []string{"Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"}

// IdleSchedule returns the i-th schedule definition (the JSON document of
// bucket schedules) of the idle mix: half daily crons in four zones with an
// overlap policy and a payload, a quarter intervals of one minute to an hour
// with a timeout and max attempts, a quarter one-shots a year after created.
// Each is effective from a day after created, so none is due within a day
// of created. The id is prefix + a kind + i; queue is every target's queue.
func IdleSchedule(prefix string, i int, queue string, created time.Time) (id string, doc []byte) {
	ts, from := created.UTC().Format(time.RFC3339), created.Add(24*time.Hour).UTC().Format(time.RFC3339)
	switch i % 4 {
	case 0, 1:
		id = fmt.Sprintf("%sreport-%06d", prefix, i)
		doc = fmt.Appendf(nil, `{"id":%q,"spec":{"cron":"%d %d * * *","zone":%q},"target":{"queue":%q,"kind":"report","payload":{"customer":%d}},"policy":{"overlap":"skip"},"created_at":%q,"effective_from":%q}`,
			id, i%60, i%24, IdleZones[i%len(IdleZones)], queue, i, ts, from)
	case 2:
		id = fmt.Sprintf("%ssync-%06d", prefix, i)
		doc = fmt.Appendf(nil, `{"id":%q,"spec":{"interval":{"every":"%ds"}},"target":{"queue":%q,"kind":"sync","timeout":"30s","max_attempts":3},"created_at":%q,"effective_from":%q}`,
			id, 60+i%3600, queue, ts, from)
	default:
		id = fmt.Sprintf("%sonce-%06d", prefix, i)
		doc = fmt.Appendf(nil, `{"id":%q,"spec":{"at":%q},"target":{"queue":%q,"kind":"once"},"created_at":%q,"effective_from":%q}`,
			id, created.AddDate(1, 0, 0).UTC().Format(time.RFC3339), queue, ts, from)
	}
	return id, doc
}
