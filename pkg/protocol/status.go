package protocol

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// LatestJobEvent reads a job's status, its latest event (§3.3 of
// docs/protocol.md): the last message of EVENTS on the job's event
// subjects, narrowed to its queue and kind when both are given. It returns
// the event and its sequence in EVENTS, or nil and 0 when the job has no
// event (not run yet, or unknown).
func LatestJobEvent(ctx context.Context, events jetstream.Stream, queue, kind, jobID string) (*jetfleetpb.JobEvent, uint64, error) {
	subject := JobEventsOfID(jobID)
	if queue != "" && kind != "" {
		subject = JobEventsOfJob(queue, kind, jobID)
	}
	m, err := events.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var ev jetfleetpb.JobEvent
	if err := Unmarshal(m.Data, &ev); err != nil {
		return nil, 0, err
	}
	return &ev, m.Sequence, nil
}

// RunEndEvents are the job event types that end a job's run: succeeded,
// skipped_duplicate (an earlier delivery succeeded), dead and cancelled (§4).
var RunEndEvents = []string{EventSucceeded, EventSkippedDuplicate, EventDead, EventCancelled}

// RunOver reports whether an event of type eventType ends a job's run.
func RunOver(eventType string) bool {
	switch eventType {
	case EventSucceeded, EventSkippedDuplicate, EventDead, EventCancelled:
		return true
	}
	return false
}
