package jetfleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// StateRunning is the State of a job whose latest event is a progress
// report: it runs, and Progress says how far it got.
const StateRunning = "running"

// Progress is how far a running job got, as its handler last reported
// (docs/protocol.md §3.9).
type Progress struct {
	// Fraction is from 0 to 1.
	Fraction float64 `json:"fraction"`
	// Message says what the job is doing, at most 256 bytes.
	Message string `json:"message,omitempty"`
	// Time is when the handler reported it.
	Time time.Time `json:"time"`
}

// String is the report as the CLI prints it: "40% — resizing image 4 of 10".
func (p *Progress) String() string {
	pct := strconv.FormatFloat(math.Floor(p.Fraction*100), 'f', 0, 64) + "%"
	if p.Message == "" {
		return pct
	}
	return pct + " — " + p.Message
}

// ProgressOfEvent is the report a progress event carries, or nil for any
// other event.
func ProgressOfEvent(ev *jetfleetpb.JobEvent) *Progress {
	if ev.GetType() != protocol.EventProgress {
		return nil
	}
	return &Progress{Fraction: ev.GetProgress(), Message: ev.GetProgressMessage(), Time: ev.GetTime().AsTime()}
}

// JobInfo is a job's status: what its latest event says (docs/protocol.md
// §3.3). A job that waits in its queue has none until an agent takes it
// (Client.Job: not_found); a delayed job's is StateDelayed, and a job
// cancelled before it ran has its cancelled event.
type JobInfo struct {
	ID    string `json:"job_id"`
	Queue string `json:"queue"`
	Kind  string `json:"kind"`
	// State is the latest event's type: started, succeeded, retrying,
	// snoozed, released, failed, cancelled, dead, rescued, timed_out,
	// skipped_duplicate or waiting (for its kind's fleet-wide limit, Reason
	// says which; SetLimit); StateRunning (running) when it is a progress
	// report; or StateDelayed for a job waiting for its process_at.
	State string `json:"state"`
	// Progress is the running job's latest progress report, when its latest
	// event is one (State running).
	Progress    *Progress `json:"progress,omitempty"`
	Attempt     int       `json:"attempt"`
	MaxAttempts int       `json:"max_attempts"`
	AgentID     string    `json:"agent_id,omitempty"`
	Error       string    `json:"error,omitempty"`
	ErrorCode   string    `json:"error_code,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	Time        time.Time `json:"time"`
	// ProcessAt is when a delayed job (State delayed) becomes due.
	ProcessAt time.Time `json:"process_at,omitzero"`
	// Result is what the job's handler returned, on a succeeded job that
	// recorded one (agent.RecordResult; docs/protocol.md §3.10): a JSON
	// document. Decode it with DecodeResult.
	Result json.RawMessage `json:"result,omitempty"`
	// Event is the latest JobEvent, every field of it; nil for a delayed job.
	Event *jetfleetpb.JobEvent `json:"-"`
}

// StateDelayed is the State of a job waiting in DELAYED for its process_at.
const StateDelayed = "delayed"

// Done reports whether the job's run is over: succeeded (or an earlier
// delivery did, skipped_duplicate), dead-lettered or cancelled. Succeeded
// tells the first apart from the others.
func (j *JobInfo) Done() bool { return protocol.RunOver(j.State) }

// Succeeded reports whether the job's run succeeded.
func (j *JobInfo) Succeeded() bool {
	return j.State == protocol.EventSucceeded || j.State == protocol.EventSkippedDuplicate
}

func jobInfo(ev *jetfleetpb.JobEvent) *JobInfo {
	info := &JobInfo{ID: ev.GetJobId(), Queue: ev.GetQueue(), Kind: ev.GetKind(), State: ev.GetType(),
		Attempt: int(ev.GetAttempt()), MaxAttempts: int(ev.GetMaxAttempts()), AgentID: ev.GetAgentId(),
		Error: ev.GetError(), ErrorCode: ev.GetErrorCode(), Reason: ev.GetReason(), Time: ev.GetTime().AsTime(), Event: ev}
	if info.Progress = ProgressOfEvent(ev); info.Progress != nil {
		info.State = StateRunning
	}
	info.Result = ResultOfEvent(ev)
	return info
}

// ResultOfEvent is the result a succeeded event carries, or nil. A result
// that is not JSON (a foreign agent's) is returned as a JSON string of it.
func ResultOfEvent(ev *jetfleetpb.JobEvent) json.RawMessage {
	r := ev.GetResult()
	switch {
	case len(r) == 0:
		return nil
	case json.Valid(r):
		return r
	}
	s, _ := json.Marshal(string(r))
	return s
}

// ErrNoResult is what DecodeResult returns for a job without a result.
var ErrNoResult = errors.New("jetfleet: the job has no result")

// DecodeResult decodes the job's result into v, as encoding/json does;
// ErrNoResult when it has none (it did not succeed, or its handler recorded
// nothing).
func (j *JobInfo) DecodeResult(v any) error {
	if len(j.Result) == 0 {
		return ErrNoResult
	}
	return json.Unmarshal(j.Result, v)
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

// WaitOption narrows what Wait waits for.
type WaitOption func(*waitFor)

type waitFor struct{ seq uint64 }

// WaitForSequence waits for the run of the job message at seq in JOBS
// (EnqueueResult.Sequence, ReplayResult.JobSequence): a job id enqueued
// again, or a replayed dead letter, is a new run whose events are told
// apart from the earlier run's by this sequence.
func WaitForSequence(seq uint64) WaitOption { return func(w *waitFor) { w.seq = seq } }

// Wait waits until the job's run is over and returns its final status; a
// dead job also returns a *JobFailedError. A cancelled job returns no error
// and the State "cancelled": check Succeeded, not only the error. It follows the job's stored
// events (an ordered consumer: the latest of each type, then every new one
// in stream order), so no event falls between reading the state and
// following it. Without WaitForSequence, the latest run is meant: the
// latest event once the stored ones are read.
func (c *Client) Wait(ctx context.Context, id string, opts ...WaitOption) (*JobInfo, error) {
	if err := protocol.ValidateJobID(id); err != nil {
		return nil, protocol.FieldError("job_id", "%v", err)
	}
	var w waitFor
	for _, o := range opts {
		o(&w)
	}
	cons, err := c.js.OrderedConsumer(ctx, protocol.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.JobEventsOfID(id)},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("wait for job %s: %w", id, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("wait for job %s: %w", id, err)
	}
	defer it.Stop()
	var info *JobInfo
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return info, fmt.Errorf("wait for job %s: %w", id, err)
		}
		var ev jetfleetpb.JobEvent
		if protocol.Unmarshal(m.Data(), &ev) != nil || (w.seq != 0 && ev.GetStreamSequence() != w.seq) {
			continue
		}
		info = jobInfo(&ev)
		if meta, err := m.Metadata(); err == nil && meta.NumPending > 0 {
			continue // a later stored event follows: judge by the latest
		}
		if !info.Done() {
			continue
		}
		if info.State == protocol.EventDead {
			return info, &JobFailedError{Job: info}
		}
		return info, nil
	}
}

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
