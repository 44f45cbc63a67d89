package jetfleet

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// JobInfo is a job's status: what its latest event says (docs/protocol.md
// §3.3). A job has no status until an agent takes it.
type JobInfo struct {
	ID    string `json:"job_id"`
	Queue string `json:"queue"`
	Kind  string `json:"kind"`
	// State is the latest event's type: started, succeeded, retrying,
	// snoozed, released, failed, cancelled, dead, rescued, timed_out or
	// skipped_duplicate; or StateDelayed for a job waiting for its
	// process_at.
	State       string    `json:"state"`
	Attempt     int       `json:"attempt"`
	MaxAttempts int       `json:"max_attempts"`
	AgentID     string    `json:"agent_id,omitempty"`
	Error       string    `json:"error,omitempty"`
	ErrorCode   string    `json:"error_code,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	Time        time.Time `json:"time"`
	// ProcessAt is when a delayed job (State delayed) becomes due.
	ProcessAt time.Time `json:"process_at,omitzero"`
	// Event is the latest JobEvent, every field of it; nil for a delayed job.
	Event *jetfleetpb.JobEvent `json:"-"`
}

// StateDelayed is the State of a job waiting in DELAYED for its process_at.
const StateDelayed = "delayed"

// Done reports whether the job's run is over: succeeded (or an earlier
// delivery did, skipped_duplicate) or dead-lettered.
func (j *JobInfo) Done() bool { return protocol.RunOver(j.State) }

// Succeeded reports whether the job's run succeeded.
func (j *JobInfo) Succeeded() bool {
	return j.State == protocol.EventSucceeded || j.State == protocol.EventSkippedDuplicate
}

func jobInfo(ev *jetfleetpb.JobEvent) *JobInfo {
	return &JobInfo{ID: ev.GetJobId(), Queue: ev.GetQueue(), Kind: ev.GetKind(), State: ev.GetType(),
		Attempt: int(ev.GetAttempt()), MaxAttempts: int(ev.GetMaxAttempts()), AgentID: ev.GetAgentId(),
		Error: ev.GetError(), ErrorCode: ev.GetErrorCode(), Reason: ev.GetReason(), Time: ev.GetTime().AsTime(), Event: ev}
}

// Job returns a job's status; a delayed job's is StateDelayed. A job
// without any event yet — still queued, or unknown — is a not_found error (errors.Is(err,
// protocol.Code(protocol.CodeNotFound))).
func (c *Client) Job(ctx context.Context, id string) (*JobInfo, error) {
	if err := protocol.ValidateJobID(id); err != nil {
		return nil, protocol.FieldError("job_id", "%v", err)
	}
	events, err := c.eventsStream(ctx)
	if err != nil {
		return nil, err
	}
	ev, _, err := protocol.LatestJobEvent(ctx, events, "", "", id)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	delayedJobs, err := c.delayedStream(ctx)
	if err != nil {
		return nil, err
	}
	d, err := protocol.LookupDelayed(ctx, delayedJobs, "", "", id)
	if err != nil {
		return nil, fmt.Errorf("job %s: %w", id, err)
	}
	if d != nil && (ev == nil || protocol.RunOver(ev.GetType())) {
		// Waiting for its time (an id whose earlier run is over may be
		// enqueued again, delayed).
		return &JobInfo{ID: id, Queue: d.Queue, Kind: d.Kind, State: StateDelayed, ProcessAt: d.ProcessAt}, nil
	}
	if ev == nil {
		return nil, protocol.Errorf(protocol.CodeNotFound, "job %s has no event yet: it is queued, or there is no such job", id).WithField("job_id")
	}
	return jobInfo(ev), nil
}

// JobFailedError is what Wait returns for a job that was dead-lettered.
type JobFailedError struct{ Job *JobInfo }

func (e *JobFailedError) Error() string {
	msg := fmt.Sprintf("job %s (%s on queue %s) is dead: %s", e.Job.ID, e.Job.Kind, e.Job.Queue, e.Job.Reason)
	if e.Job.Error != "" {
		msg += ": " + e.Job.Error
	}
	return msg
}

// Wait waits until the job's run is over and returns its final status; a
// dead job also returns a *JobFailedError. It watches the job's events as
// they are published, so it returns at once when the run ends; ctx bounds
// the wait.
func (c *Client) Wait(ctx context.Context, id string) (*JobInfo, error) {
	if err := protocol.ValidateJobID(id); err != nil {
		return nil, protocol.FieldError("job_id", "%v", err)
	}
	events := make(chan *nats.Msg, 64)
	// Subscribe first, then read the latest event: nothing can fall in between.
	sub, err := c.nc.ChanSubscribe(protocol.JobEventsOfID(id), events)
	if err != nil {
		return nil, fmt.Errorf("wait for job %s: %w", id, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := c.nc.FlushWithContext(ctx); err != nil {
		return nil, fmt.Errorf("wait for job %s: %w", id, err)
	}
	info, err := c.Job(ctx, id)
	for {
		switch {
		case err == nil && info.Done():
			if info.State == protocol.EventDead {
				return info, &JobFailedError{Job: info}
			}
			return info, nil
		case err != nil && !isNotFound(err):
			return info, err
		}
		select {
		case <-ctx.Done():
			return info, fmt.Errorf("wait for job %s: %w", id, ctx.Err())
		case m := <-events:
			var ev jetfleetpb.JobEvent
			if protocol.Unmarshal(m.Data, &ev) == nil {
				info, err = jobInfo(&ev), nil
			}
		}
	}
}

func isNotFound(err error) bool { return protocol.IsCode(err, protocol.CodeNotFound) }

// eventsStream is the EVENTS stream, looked up once.
func (c *Client) eventsStream(ctx context.Context) (jetstream.Stream, error) {
	return c.stream(ctx, &c.events, protocol.StreamEvents)
}

// delayedStream is the DELAYED stream, looked up once.
func (c *Client) delayedStream(ctx context.Context) (jetstream.Stream, error) {
	return c.stream(ctx, &c.delayed, protocol.StreamDelayed)
}

func (c *Client) stream(ctx context.Context, cached *jetstream.Stream, name string) (jetstream.Stream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if *cached != nil {
		return *cached, nil
	}
	s, err := c.js.Stream(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	*cached = s
	return s, nil
}
