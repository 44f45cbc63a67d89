package protocol

import "time"

// Workflow events (docs/protocol.md §8.4): the supervisor records a run's
// start and end and each step's start and end, in EVENTS, on
// events.workflow.<workflow>.<type>.<run id>. A step's jobs keep their own
// job events (§4).

// WorkflowEventsSubjects matches every workflow event.
const WorkflowEventsSubjects = "events.workflow.>"

// Workflow event types (WorkflowEvent.Type).
const (
	WorkflowRunStarted    = "run_started"
	WorkflowRunSucceeded  = "run_succeeded"
	WorkflowRunFailed     = "run_failed"
	WorkflowRunCancelled  = "run_cancelled"
	WorkflowStepStarted   = "step_started"
	WorkflowStepSucceeded = "step_succeeded"
	WorkflowStepFailed    = "step_failed"
	WorkflowStepSkipped   = "step_skipped"
	WorkflowStepCancelled = "step_cancelled"
)

// IsWorkflowStepEnd reports whether typ ends a step.
func IsWorkflowStepEnd(typ string) bool {
	switch typ {
	case WorkflowStepSucceeded, WorkflowStepFailed, WorkflowStepSkipped, WorkflowStepCancelled:
		return true
	}
	return false
}

// WorkflowEventSubject is where a workflow event of type typ is published.
func WorkflowEventSubject(workflow, typ, runID string) string {
	return "events.workflow." + workflow + "." + typ + "." + runID
}

// WorkflowEvent is the JSON document of a workflow event.
type WorkflowEvent struct {
	Type     string    `json:"type"`
	Workflow string    `json:"workflow"`
	RunID    string    `json:"run_id"`
	Round    int       `json:"round"`
	Time     time.Time `json:"time"`
	// Step names the step of a step event.
	Step string `json:"step,omitempty"`
	// Error is a failed step's error, or a failed run's own.
	Error string `json:"error,omitempty"`
	// Elements counts a fan-out step's elements by status (step_* events
	// of a fan-out).
	Elements map[string]int `json:"elements,omitempty"`
	// FailedSteps and FailedElements count what failed (run_* end events).
	FailedSteps    int `json:"failed_steps,omitempty"`
	FailedElements int `json:"failed_elements,omitempty"`
	// JobID is the job the run stands for, when it was started as one.
	JobID string `json:"job_id,omitempty"`
	// TraceID is the run's trace.
	TraceID string `json:"trace_id,omitempty"`
}
