package protocol

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DelayedJob is a job waiting in DELAYED for its time (docs/protocol.md §2.2).
type DelayedJob struct {
	JobID     string    `json:"job_id"`
	Queue     string    `json:"queue"`
	Kind      string    `json:"kind"`
	ProcessAt time.Time `json:"process_at"`
	// Sequence is its message's sequence in DELAYED.
	Sequence uint64 `json:"sequence"`
}

// LookupDelayed finds the delayed job jobID in the DELAYED stream (queue
// and kind may be empty when unknown); nil when there is none.
func LookupDelayed(ctx context.Context, delayed jetstream.Stream, queue, kind, jobID string) (*DelayedJob, error) {
	subject := DelayedOfID(jobID)
	if queue != "" && kind != "" {
		subject = DelayedSubject(queue, kind, jobID)
	}
	m, err := delayed.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	d := DelayedJobOf(m.Subject, m.Header.Get(HeaderNatsSchedule), m.Sequence)
	d.JobID = jobID
	return d, nil
}

// DelayedJobOf reads a delayed job's message: its subject, its
// Nats-Schedule header and its sequence. The job id is the token's (a
// b64_ token is decoded).
func DelayedJobOf(subject, schedule string, seq uint64) *DelayedJob {
	d := &DelayedJob{Sequence: seq}
	var token string
	d.Queue, d.Kind, token, _ = ParseDelayedSubject(subject)
	d.JobID = JobIDOfToken(token)
	if at, ok := strings.CutPrefix(schedule, "@at "); ok {
		d.ProcessAt, _ = time.Parse(time.RFC3339Nano, at)
	}
	return d
}
