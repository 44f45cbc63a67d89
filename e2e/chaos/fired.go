package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// scheduleEvents is what the scheduler said about the run's schedules in
// a window: when each (schedule, nominal second) was fired — the fired
// event's time, set once JetStream had stored the job; the first of each
// pair (a duplicate fire would show as a second one; the effects count
// those) — and the nominal times it declared missed.
type scheduleEvents struct {
	fired  map[string]map[int64]time.Time
	missed []string // "<schedule>@<nominal>" (×count)
}

// readScheduleEvents reads the fired and missed events of the run's
// schedules whose nominal time is in [from, to] from stream EVENTS.
func readScheduleEvents(ctx context.Context, js jetstream.JetStream, schedules []string, from, to time.Time) (scheduleEvents, error) {
	wanted := map[string]bool{}
	for _, s := range schedules {
		wanted[s] = true
	}
	out := scheduleEvents{fired: map[string]map[int64]time.Time{}}
	start := from.Add(-time.Minute) // a fire is never decided before its nominal time; a minute covers clock skew
	cons, err := js.OrderedConsumer(ctx, protocol.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.ScheduleEventSubject("*", protocol.EventFired), protocol.ScheduleEventSubject("*", protocol.EventMissed)},
		DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
		OptStartTime:   &start,
	})
	if err != nil {
		return out, fmt.Errorf("schedule events: %w", err)
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return out, fmt.Errorf("schedule events: %w", err)
		}
		n, caughtUp := 0, false
		for msg := range batch.Messages() {
			n++
			meta, err := msg.Metadata()
			if err != nil {
				return out, fmt.Errorf("schedule events: %w", err)
			}
			caughtUp = meta.NumPending == 0
			var ev jetfleetpb.ScheduleEvent
			if protocol.Unmarshal(msg.Data(), &ev) != nil || !wanted[ev.GetScheduleId()] {
				continue
			}
			nominal := ev.GetNominalTime().AsTime()
			if nominal.Before(from) || nominal.After(to) {
				continue
			}
			if ev.GetType() == protocol.EventMissed {
				out.missed = append(out.missed, fmt.Sprintf("%s@%s×%d", ev.GetScheduleId(), nominal.UTC().Format("15:04:05"), max(ev.GetCount(), 1)))
				continue
			}
			byNominal := out.fired[ev.GetScheduleId()]
			if byNominal == nil {
				byNominal = map[int64]time.Time{}
				out.fired[ev.GetScheduleId()] = byNominal
			}
			// The event's time, not its store time: the scheduler sets it once
			// JetStream has stored the job; the event itself may wait longer
			// (EVENTS electing a leader) without delaying the fire.
			decided := ev.GetTime().AsTime()
			if first, seen := byNominal[nominal.Unix()]; !seen || decided.Before(first) {
				byNominal[nominal.Unix()] = decided
			}
		}
		if err := batch.Error(); err != nil {
			return out, fmt.Errorf("schedule events: %w", err)
		}
		if n == 0 || caughtUp {
			return out, nil
		}
	}
	return out, ctx.Err()
}

// latestFire is the longest wait from a nominal time in [from, to] to its
// fire, and that nominal time.
func (se scheduleEvents) latestFire(from, to time.Time) (time.Duration, time.Time) {
	var latest time.Duration
	var at time.Time
	for _, byNominal := range se.fired {
		for sec, decided := range byNominal {
			if sec < from.Unix() || sec > to.Unix() {
				continue
			}
			if wait := decided.Sub(time.Unix(sec, 0)); wait > latest {
				latest, at = wait, time.Unix(sec, 0)
			}
		}
	}
	return latest, at
}
