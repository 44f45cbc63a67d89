package jetfleet

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// A job's or schedule's timeline: every event stored about it in EVENTS,
// with the operator actions recorded beside them (protocol.Audit).

// TimelineEntry is one stored event: a JobEvent, a ScheduleEvent or an
// Audit record, with its place in EVENTS.
type TimelineEntry struct {
	Sequence uint64    `json:"sequence"`
	Stored   time.Time `json:"stored"`
	Subject  string    `json:"subject"`
	// Exactly one of these is set.
	Job      *jetfleetpb.JobEvent      `json:"-"`
	Schedule *jetfleetpb.ScheduleEvent `json:"-"`
	Audit    *protocol.Audit           `json:"-"`
}

// Type is the entry's event type, or "action: <action>" for an audit record.
func (e *TimelineEntry) Type() string {
	switch {
	case e.Job != nil:
		return e.Job.GetType()
	case e.Schedule != nil:
		return e.Schedule.GetType()
	case e.Audit != nil:
		return "action: " + e.Audit.Action
	}
	return ""
}

// JobTimeline returns every event of a job and every action on it, oldest
// first, at most limit (0: 1000) of each.
func (c *Client) JobTimeline(ctx context.Context, jobID string, limit int) ([]TimelineEntry, error) {
	if err := protocol.ValidateJobID(jobID); err != nil {
		return nil, protocol.FieldError("job_id", "%v", err)
	}
	return c.timeline(ctx, limit, protocol.JobEventsOfID(jobID), protocol.AuditJobSubject(jobID))
}

// ScheduleTimeline returns the newest events of a schedule (fired, skipped,
// missed, paused, …) and the actions on it, newest first, at most limit
// (0: 200) of each.
func (c *Client) ScheduleTimeline(ctx context.Context, scheduleID string, limit int) ([]TimelineEntry, error) {
	if err := protocol.ValidateToken("schedule id", scheduleID); err != nil {
		return nil, protocol.FieldError("schedule_id", "%v", err)
	}
	if limit <= 0 {
		limit = 200
	}
	events, err := c.eventsStream(ctx)
	if err != nil {
		return nil, err
	}
	info, err := events.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []TimelineEntry
	for _, filter := range []string{protocol.ScheduleEventSubject(scheduleID, "*"), protocol.AuditScheduleSubject(scheduleID)} {
		msgs, _, _, err := protocol.BackwardScan{Stream: protocol.StreamEvents, Filter: filter, First: info.State.FirstSeq,
			Last: info.State.LastSeq, Want: limit}.Run(ctx, c.nc)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if e, ok := decodeEntry(m); ok {
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b TimelineEntry) int { return cmpSeq(b.Sequence, a.Sequence) })
	return out, nil
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// timeline reads every message on filters, oldest first.
func (c *Client) timeline(ctx context.Context, limit int, filters ...string) ([]TimelineEntry, error) {
	if limit <= 0 {
		limit = 1000
	}
	var out []TimelineEntry
	for _, filter := range filters {
		n := 0
		for seq := uint64(1); n < limit; {
			msgs, err := protocol.DirectGetBatch(ctx, c.nc, protocol.StreamEvents,
				protocol.DirectGetRequest{Seq: seq, NextBySubject: filter, Batch: min(limit-n, 1000)})
			if err != nil {
				return nil, err
			}
			for _, m := range msgs {
				if e, ok := decodeEntry(m); ok {
					out = append(out, e)
				}
				seq = m.Sequence + 1
			}
			n += len(msgs)
			if len(msgs) < min(limit-n+len(msgs), 1000) || len(msgs) == 0 {
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b TimelineEntry) int { return cmpSeq(a.Sequence, b.Sequence) })
	return out, nil
}

func decodeEntry(m protocol.StoredMsg) (TimelineEntry, bool) {
	e := TimelineEntry{Sequence: m.Sequence, Stored: m.Time, Subject: m.Subject}
	subject, ok := protocol.ParseEventSubject(m.Subject)
	switch {
	case ok && subject.Of == "job":
		var ev jetfleetpb.JobEvent
		if protocol.Unmarshal(m.Data, &ev) != nil {
			return e, false
		}
		e.Job = &ev
	case ok && subject.Of == "schedule":
		var ev jetfleetpb.ScheduleEvent
		if protocol.Unmarshal(m.Data, &ev) != nil {
			return e, false
		}
		e.Schedule = &ev
	default:
		var a protocol.Audit
		if json.Unmarshal(m.Data, &a) != nil || a.Type != protocol.AuditType {
			return e, false
		}
		e.Audit = &a
	}
	return e, true
}

// RecordAction stores an operator action in EVENTS on subject (one of the
// protocol.Audit*Subject) and waits until it is stored.
func (c *Client) RecordAction(ctx context.Context, subject string, a *protocol.Audit) error {
	a.Type = protocol.AuditType
	if a.Time.IsZero() {
		a.Time = time.Now().UTC()
	}
	if a.Outcome == "" {
		a.Outcome = "ok"
	}
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	if _, err := c.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}); err != nil {
		return fmt.Errorf("record action %s: %w", a.Action, err)
	}
	return nil
}
