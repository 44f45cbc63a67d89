package jetfleet

import (
	"encoding/json"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// The supervisor's fleet API (agents, running jobs, history, status,
// queues): its wire types, and the Client's methods.

// Agent states as the supervisor sees them.
const (
	AgentAlive    = "alive"
	AgentDraining = "draining"
	AgentDead     = "dead"
)

// AgentInfo is an agent as the supervisor sees it.
type AgentInfo struct {
	ID        string        `json:"id"`
	State     string        `json:"state"`
	Hostname  string        `json:"hostname,omitempty"`
	PID       int64         `json:"pid,omitempty"`
	Version   string        `json:"version,omitempty"`
	Queues    []string      `json:"queues,omitempty"`
	Kinds     []string      `json:"kinds,omitempty"`
	Capacity  int           `json:"capacity"`
	Jobs      int           `json:"jobs"`
	Interval  time.Duration `json:"interval"`
	StartedAt time.Time     `json:"started_at,omitzero"`
	LastSeen  time.Time     `json:"last_seen"`
	SilentFor time.Duration `json:"silent_for"`
	DeadAt    time.Time     `json:"dead_at,omitzero"`
}

// AgentsResponse lists agents.
type AgentsResponse struct {
	Agents []AgentInfo `json:"agents"`
}

// RunningJob is a job an agent holds, from its latest heartbeat.
type RunningJob struct {
	AgentID        string    `json:"agent_id"`
	JobID          string    `json:"job_id"`
	Queue          string    `json:"queue"`
	Kind           string    `json:"kind"`
	Attempt        uint32    `json:"attempt"`
	Delivered      uint64    `json:"delivered"`
	StreamSequence uint64    `json:"stream_sequence"`
	StartedAt      time.Time `json:"started_at,omitzero"`
	Deadline       time.Time `json:"deadline,omitzero"`
	// State is running, overdue (past its deadline), cancel_sent,
	// timed_out (the supervisor failed the attempt) or ack_overdue
	// (JetStream delivered the job again: no ack or progress within AckWait).
	State string `json:"state"`
	// Progress is the handler's latest progress report, nil while it has
	// reported none.
	Progress *Progress `json:"progress,omitempty"`
}

// RunningJobsRequest filters running jobs.
type RunningJobsRequest struct {
	Queue   string `json:"queue,omitempty"`
	Kind    string `json:"kind,omitempty"`
	AgentID string `json:"agent_id,omitempty"`
}

// RunningJobsResponse lists running jobs.
type RunningJobsResponse struct {
	Jobs []RunningJob `json:"jobs"`
}

// JobDetailRequest names a job; Queue and Kind narrow the lookup when known.
type JobDetailRequest struct {
	JobID string `json:"job_id"`
	Queue string `json:"queue,omitempty"`
	Kind  string `json:"kind,omitempty"`
}

// JobDetail is a job's status: its latest event, and where it runs now.
type JobDetail struct {
	JobID string `json:"job_id"`
	// Event is the latest JobEvent document; EventSequence its sequence in EVENTS.
	Event         json.RawMessage `json:"event,omitempty"`
	EventSequence uint64          `json:"event_sequence,omitempty"`
	Running       []RunningJob    `json:"running,omitempty"`
	// Progress is the running job's latest progress report: from the
	// heartbeat of the agent running it, else from its latest event when
	// that is a progress report.
	Progress *Progress `json:"progress,omitempty"`
	// Delayed is set while the job waits in DELAYED for its process_at.
	Delayed *protocol.DelayedJob `json:"delayed,omitempty"`
	// Result is what a succeeded job's handler returned (JobInfo.Result).
	Result json.RawMessage `json:"result,omitempty"`
}

// Decode returns the latest event, or nil.
func (r *JobDetail) Decode() (*jetfleetpb.JobEvent, error) {
	if len(r.Event) == 0 {
		return nil, nil
	}
	var ev jetfleetpb.JobEvent
	return &ev, protocol.Unmarshal(r.Event, &ev)
}

// HistoryRequest asks for the last executions of a kind (in Queue, or in
// every queue) or of a schedule.
type HistoryRequest struct {
	Queue      string `json:"queue,omitempty"`
	Kind       string `json:"kind,omitempty"`
	ScheduleID string `json:"schedule_id,omitempty"`
	// Limit defaults to supervisor.history_size.
	Limit int `json:"limit,omitempty"`
}

// HistoryResponse holds Execution documents, newest first, and their statistics.
type HistoryResponse struct {
	Executions []json.RawMessage `json:"executions"`
	Stats      HistoryStats      `json:"stats"`
}

// Decode returns the executions.
func (r *HistoryResponse) Decode() ([]*jetfleetpb.Execution, error) {
	out := make([]*jetfleetpb.Execution, len(r.Executions))
	for i, raw := range r.Executions {
		out[i] = &jetfleetpb.Execution{}
		if err := protocol.Unmarshal(raw, out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// FleetStatus is the fleet at a glance.
type FleetStatus struct {
	// Replica is the holder name of the replica that answered; Leader is
	// the holder of the lease.
	Replica     string        `json:"replica"`
	Leader      string        `json:"leader,omitempty"`
	AgentsAlive int           `json:"agents_alive"`
	AgentsDrain int           `json:"agents_draining"`
	AgentsDead  int           `json:"agents_dead"`
	Capacity    int           `json:"capacity"`
	Running     int           `json:"running"`
	Queues      []QueueStatus `json:"queues"`
	DLQDepth    uint64        `json:"dlq_depth"`
	// Delayed counts the delayed jobs waiting for their process_at.
	Delayed uint64 `json:"delayed"`
	// Unroutable counts the jobs in JOBS that no queue consumer delivers
	// (a queue without a consumer, a subject of the wrong shape); the
	// leader dead-letters them after supervisor.unroutable_after.
	Unroutable uint64 `json:"unroutable"`
	// Attention lists running jobs past their deadline or whose ack is overdue.
	Attention []RunningJob `json:"attention,omitempty"`
}

// QueueStatus is one queue's consumer.
type QueueStatus struct {
	Queue string `json:"queue"`
	// Pending counts the jobs waiting, every priority together;
	// PendingByPriority splits them when a job of another priority than
	// default waits (high, default, low).
	Pending           uint64            `json:"pending"`
	PendingByPriority map[string]uint64 `json:"pending_by_priority,omitempty"`
	AckPending        int               `json:"ack_pending"`
	Redelivered       int               `json:"redelivered"`
	Waiting           int               `json:"waiting"`
	AckWait           time.Duration     `json:"ack_wait"`
	MaxDeliver        int               `json:"max_deliver"`
	Paused            bool              `json:"paused,omitempty"`
	PausedUntil       time.Time         `json:"paused_until,omitzero"`
	// Breaker is open while the circuit breaker holds the queue paused.
	Breaker string `json:"breaker"`
	// Declared is set for a queue declared under topology.queues (the
	// supervisor keeps its consumer at the declared settings).
	Declared bool `json:"declared,omitempty"`
}

// HistoryStats aggregates executions.
type HistoryStats struct {
	Executions int `json:"executions"`
	Succeeded  int `json:"succeeded"`
	Dead       int `json:"dead"`
	// Cancelled runs count neither as successes nor as failures.
	Cancelled   int     `json:"cancelled,omitempty"`
	SuccessRate float64 `json:"success_rate"`
	// P50 and P95 are percentiles of the last attempt's run time.
	P50 time.Duration `json:"p50"`
	P95 time.Duration `json:"p95"`
	// ConsecutiveFailures is the count of dead runs in a row at the end.
	ConsecutiveFailures int `json:"consecutive_failures"`
}

// QueuesResponse lists the queues (their consumers) and the jobs on
// subjects no queue serves.
type QueuesResponse struct {
	Queues []QueueStatus `json:"queues"`
	// Unroutable counts, by subject, the jobs in JOBS no consumer delivers;
	// the leader dead-letters them after supervisor.unroutable_after.
	Unroutable map[string]uint64 `json:"unroutable,omitempty"`
}

// QueueAddRequest creates a queue's consumer. Zero settings take the
// defaults (topology.queues settings apply to declared queues only).
type QueueAddRequest struct {
	Queue         string        `json:"queue"`
	AckWait       time.Duration `json:"ack_wait,omitempty"`
	MaxDeliver    int           `json:"max_deliver,omitempty"`
	MaxAckPending int           `json:"max_ack_pending,omitempty"`
}

// QueueAddResponse is the queue after the request; Created is false when it
// existed already with these settings.
type QueueAddResponse struct {
	Queue   QueueStatus `json:"queue"`
	Created bool        `json:"created"`
}

// QueueRemoveRequest deletes a queue's consumer. A queue that still holds
// jobs is refused unless Force: its jobs are then dead-lettered with reason
// unroutable.
type QueueRemoveRequest struct {
	Queue string `json:"queue"`
	Force bool   `json:"force,omitempty"`
}

// QueueRemoveResponse says how many jobs the removed queue still held.
type QueueRemoveResponse struct {
	Queue string `json:"queue"`
	Jobs  uint64 `json:"jobs"`
}
