package jetfleet

import (
	"context"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// The supervisor's job listing by state (jetfleet.api.supervisor.jobs.ls):
// its wire types and the Client's method.

// Job states of a listing. Queued, delayed, running and failed jobs are
// messages still in JOBS, classified by their latest event and the agents'
// heartbeats; succeeded and dead jobs are read from their events in EVENTS.
const (
	// JobQueued: in JOBS, waiting for an agent (never delivered, or handed
	// back or rescued for an immediate redelivery).
	JobQueued = "queued"
	// JobDelayed: waiting for a later time — in DELAYED until its
	// process_at, or in JOBS snoozed (no attempt spent).
	JobDelayed = "delayed"
	// JobRunning: an agent holds it now (its heartbeats list it), or its
	// latest event says it started.
	JobRunning = "running"
	// JobFailed: its latest attempt failed (retrying after a backoff, timed
	// out, or on its way to the dead letters).
	JobFailed = "failed"
	// JobSucceeded: its run ended in success (newest first).
	JobSucceeded = "succeeded"
	// JobDead: its run ended in the dead letters (newest first).
	JobDead = "dead"
	// JobCancelled: its run was cancelled (newest first).
	JobCancelled = "cancelled"
)

// JobStates lists the states of a listing, in a job's order of life.
var JobStates = []string{JobQueued, JobDelayed, JobRunning, JobFailed, JobSucceeded, JobDead, JobCancelled}

// ValidJobState reports whether s is one of JobStates.
func ValidJobState(s string) bool {
	for _, v := range JobStates {
		if v == s {
			return true
		}
	}
	return false
}

// JobListRequest asks for one page of the jobs in a state.
type JobListRequest struct {
	// State is one of JobStates (required).
	State string `json:"state"`
	// Queue, Kind and ScheduleID narrow the listing; empty matches all.
	Queue      string `json:"queue,omitempty"`
	Kind       string `json:"kind,omitempty"`
	ScheduleID string `json:"schedule_id,omitempty"`
	// Since and Until bound when the job entered JOBS (queued, delayed,
	// running, failed) or when its run ended (succeeded, dead).
	Since time.Time `json:"since,omitzero"`
	Until time.Time `json:"until,omitzero"`
	// Cursor is the Next of the previous page (opaque).
	Cursor uint64 `json:"cursor,omitempty"`
	// Limit defaults to 50; at most 1000.
	Limit int `json:"limit,omitempty"`
}

// Validate checks r, naming the bad field.
func (r JobListRequest) Validate() error {
	if !ValidJobState(r.State) {
		return protocol.FieldError("state", "must be one of queued, delayed, running, failed, succeeded, dead, cancelled; got %q", r.State)
	}
	for field, v := range map[string]string{"queue": r.Queue, "kind": r.Kind, "schedule_id": r.ScheduleID} {
		if v != "" {
			if err := protocol.ValidateToken(field, v); err != nil {
				return protocol.FieldError(field, "%v", err)
			}
		}
	}
	if !r.Since.IsZero() && !r.Until.IsZero() && r.Until.Before(r.Since) {
		return protocol.FieldError("until", "is before since")
	}
	if r.Limit < 0 || r.Limit > 1000 {
		return protocol.FieldError("limit", "must be 0 (default 50) to 1000, got %d", r.Limit)
	}
	return nil
}

// JobListEntry is one job of a listing.
type JobListEntry struct {
	JobID      string `json:"job_id"`
	Queue      string `json:"queue"`
	Kind       string `json:"kind"`
	ScheduleID string `json:"schedule_id,omitempty"`
	State      string `json:"state"`
	// Event is the type of the job's latest event about this message (empty
	// for a job no agent took yet).
	Event       string `json:"event,omitempty"`
	Attempt     int    `json:"attempt,omitempty"`
	MaxAttempts int    `json:"max_attempts,omitempty"`
	AgentID     string `json:"agent_id,omitempty"`
	// EnqueuedAt is when JOBS stored the message (jobs still in JOBS).
	EnqueuedAt time.Time `json:"enqueued_at,omitzero"`
	// Time is when the job entered its state: its latest event's time, or
	// EnqueuedAt.
	Time time.Time `json:"time,omitzero"`
	// RetryAt is when a delayed or failed job runs again.
	RetryAt   time.Time     `json:"retry_at,omitzero"`
	Duration  time.Duration `json:"duration,omitempty"`
	Error     string        `json:"error,omitempty"`
	ErrorCode string        `json:"error_code,omitempty"`
	Reason    string        `json:"reason,omitempty"`
	TraceID   string        `json:"trace_id,omitempty"`
	// StreamSequence is the job message's sequence in JOBS; EventSequence
	// its latest event's in EVENTS.
	StreamSequence uint64 `json:"stream_sequence,omitempty"`
	EventSequence  uint64 `json:"event_sequence,omitempty"`
}

// JobListResponse is one page. Next, when not 0, is the Cursor of the next
// page (JOBS sequences, oldest first, for jobs in JOBS; EVENTS sequences,
// newest first, for finished runs). Scanned counts the messages read.
type JobListResponse struct {
	Jobs    []JobListEntry `json:"jobs"`
	Next    uint64         `json:"next,omitempty"`
	Scanned int            `json:"scanned"`
}

// ListJobs returns one page of the jobs in a state.
func (c *Client) ListJobs(ctx context.Context, req JobListRequest) (*JobListResponse, error) {
	var res JobListResponse
	return &res, c.supervisor(ctx, protocol.APIJobList, &req, &res)
}
