package jetfleet

import (
	"context"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// CancelRequest cancels one job (JobID; Queue and Kind, when given, narrow
// the search) or the jobs that match a filter (Queue, Kind, ScheduleID: at
// least one), wherever they are: running (the supervisor tells the agent
// that holds it), queued, waiting for a retry, or delayed. A cancelled
// job's run ends with the event cancelled — no dead letter, no alert, no
// failure in its schedule's streak — unless DeadLetter.
type CancelRequest struct {
	JobID      string `json:"job_id,omitempty"`
	Queue      string `json:"queue,omitempty"`
	Kind       string `json:"kind,omitempty"`
	ScheduleID string `json:"schedule_id,omitempty"`
	// Reason is recorded as the cancelled job's error.
	Reason string `json:"reason,omitempty"`
	// DeadLetter dead-letters the jobs (reason cancelled) instead.
	DeadLetter bool `json:"dead_letter,omitempty"`
	// RequestedBy names who asked (an operator, a program), recorded with
	// the cancel.
	RequestedBy string `json:"requested_by,omitempty"`
	// Limit bounds the jobs a filter cancels. Defaults to 1000; at most 10000.
	Limit int `json:"limit,omitempty"`
}

// MaxCancelLimit bounds the jobs one filtered cancel acts on.
const MaxCancelLimit = 10_000

// Validate checks r, naming the bad field.
func (r CancelRequest) Validate() error {
	if r.JobID != "" {
		if err := protocol.ValidateJobID(r.JobID); err != nil {
			return protocol.FieldError("job_id", "%v", err)
		}
		if r.ScheduleID != "" {
			return protocol.FieldError("schedule_id", "give a job id or a filter, not both")
		}
	} else if r.Queue == "" && r.Kind == "" && r.ScheduleID == "" {
		return protocol.FieldError("job_id", "give a job id, or a filter: queue, kind or schedule_id")
	}
	for field, v := range map[string]string{"queue": r.Queue, "kind": r.Kind, "schedule_id": r.ScheduleID} {
		if v != "" {
			if err := protocol.ValidateToken(field, v); err != nil {
				return protocol.FieldError(field, "%v", err)
			}
		}
	}
	if r.Limit < 0 || r.Limit > MaxCancelLimit {
		return protocol.FieldError("limit", "must be between 0 (the default, 1000) and %d, got %d", MaxCancelLimit, r.Limit)
	}
	if len(r.Reason) > 1024 {
		return protocol.FieldError("reason", "is longer than 1024 bytes")
	}
	if len(r.RequestedBy) > 256 {
		return protocol.FieldError("requested_by", "is longer than 256 bytes")
	}
	return nil
}

// Subject is the JOBS subject filter of r's queue and kind.
func (r CancelRequest) Subject() string {
	star := func(s string) string {
		if s == "" {
			return "*"
		}
		return s
	}
	return protocol.JobSubject(star(r.Queue), star(r.Kind))
}

// Where a cancelled job was (CancelResult.Where).
const (
	// CancelRunning: an agent ran it; it ends the attempt as cancelled.
	CancelRunning = "running"
	// CancelQueued: it waited in its queue and was removed.
	CancelQueued = "queued"
	// CancelRetrying: it waited for a retry (or a redelivery) and was removed.
	CancelRetrying = "retrying"
	// CancelDelayed: it was delayed and will not be enqueued.
	CancelDelayed = "delayed"
	// CancelPending: it was not found running, queued near the front or
	// delayed; the cancel is recorded, and the agent that receives the job
	// within topology.cancel_ttl ends it as cancelled without running it.
	CancelPending = "pending"
)

// CancelResult is what happened to one job.
type CancelResult struct {
	JobID string `json:"job_id"`
	// Where is one of the Cancel* constants.
	Where   string `json:"where"`
	AgentID string `json:"agent_id,omitempty"`
	// Error is set for a job that could not be cancelled (a filter's).
	Error string `json:"error,omitempty"`
}

// CancelResponse lists the jobs cancelled.
type CancelResponse struct {
	Results []CancelResult `json:"results"`
	// Truncated is set when more jobs matched the filter than Limit.
	Truncated bool `json:"truncated,omitempty"`
}

// CancelOption sets one property of a cancel.
type CancelOption func(*CancelRequest)

// CancelReason records why.
func CancelReason(reason string) CancelOption { return func(r *CancelRequest) { r.Reason = reason } }

// CancelWithDeadLetter dead-letters the job (reason cancelled) instead of
// ending it as cancelled.
func CancelWithDeadLetter() CancelOption { return func(r *CancelRequest) { r.DeadLetter = true } }

// CancelRequestedBy names who asked.
func CancelRequestedBy(who string) CancelOption {
	return func(r *CancelRequest) { r.RequestedBy = who }
}

// Cancel cancels one job by id, wherever it is. A job whose run is already
// over is a conflict error; an unknown id is recorded as pending (a job
// still far back in its queue cannot be told from one that never existed).
func (c *Client) Cancel(ctx context.Context, jobID string, opts ...CancelOption) (*CancelResult, error) {
	req := CancelRequest{JobID: jobID}
	for _, o := range opts {
		o(&req)
	}
	res, err := c.CancelJobs(ctx, req)
	if err != nil {
		return nil, err
	}
	if len(res.Results) != 1 {
		return nil, protocol.Errorf(protocol.CodeInternal, "cancel of job %s: %d results", jobID, len(res.Results))
	}
	return &res.Results[0], nil
}

// CancelJobs cancels one job or the jobs matching a filter.
func (c *Client) CancelJobs(ctx context.Context, req CancelRequest) (*CancelResponse, error) {
	var res CancelResponse
	return &res, c.supervisor(ctx, protocol.APIJobCancel, &req, &res)
}
