package main

import (
	"context"
	"errors"
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
	// One ordered consumer, read through: each Fetch of an ordered consumer
	// deletes and creates it again (nats.go advises Messages for reading a
	// stream through), and at 500 jobs/s a loop of Fetches failed with "no
	// responders" for a minute after the phase.
	it, err := cons.Messages()
	if err != nil {
		return out, fmt.Errorf("schedule events: %w", err)
	}
	defer it.Stop()
	seen, idle := false, 0
	for {
		nextCtx, cancel := context.WithTimeout(ctx, readIdle)
		msg, err := it.Next(jetstream.NextContext(nextCtx))
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			if seen {
				continue // the last one said more were pending: a slow server
			}
			// Nothing yet: an empty window, or a consumer not yet served
			// (a stream electing its leader, a slow first scan). Only the
			// consumer's own count tells them apart; a run once took the
			// second for the first and judged its cuts on no event.
			info, err := cons.Info(ctx)
			if err != nil {
				return out, fmt.Errorf("schedule events: nothing delivered in %s, and no consumer info: %w", readIdle, err)
			}
			if info.NumPending == 0 {
				return out, nil // no event in the window
			}
			if idle++; idle == readIdleRounds {
				return out, fmt.Errorf("schedule events: %d pending, none delivered in %s", info.NumPending, readIdleRounds*readIdle)
			}
			continue
		}
		if err != nil {
			return out, fmt.Errorf("schedule events: %w", err)
		}
		seen = true
		meta, err := msg.Metadata()
		if err != nil {
			return out, fmt.Errorf("schedule events: %w", err)
		}
		out.add(msg.Data(), wanted, from, to)
		if meta.NumPending == 0 {
			return out, nil
		}
	}
}

// readIdle is how long readScheduleEvents waits for a first event before
// it takes the window as holding none.
const readIdle = 5 * time.Second

// readIdleRounds of readIdle with events pending and none delivered end a
// read with an error: the caller reads again on a new consumer.
const readIdleRounds = 6

// add records one schedule event if it is one of the run's schedules with
// a nominal time in [from, to].
func (se *scheduleEvents) add(data []byte, wanted map[string]bool, from, to time.Time) {
	var ev jetfleetpb.ScheduleEvent
	if protocol.Unmarshal(data, &ev) != nil || !wanted[ev.GetScheduleId()] {
		return
	}
	nominal := ev.GetNominalTime().AsTime()
	if nominal.Before(from) || nominal.After(to) {
		return
	}
	if ev.GetType() == protocol.EventMissed {
		se.missed = append(se.missed, fmt.Sprintf("%s@%s×%d", ev.GetScheduleId(), nominal.UTC().Format("15:04:05"), max(ev.GetCount(), 1)))
		return
	}
	byNominal := se.fired[ev.GetScheduleId()]
	if byNominal == nil {
		byNominal = map[int64]time.Time{}
		se.fired[ev.GetScheduleId()] = byNominal
	}
	// The event's time, not its store time: the scheduler sets it once
	// JetStream has stored the job; the event itself may wait longer
	// (EVENTS electing a leader) without delaying the fire.
	decided := ev.GetTime().AsTime()
	if first, seen := byNominal[nominal.Unix()]; !seen || decided.Before(first) {
		byNominal[nominal.Unix()] = decided
	}
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
