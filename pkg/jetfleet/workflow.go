package jetfleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Workflows: a definition names steps (each a job kind), their dependencies,
// fan-outs and fan-ins (protocol.WorkflowDefinition, docs/workflows.md); a
// run of it is advanced by the supervisor leader from its jobs' events. The
// types below are the supervisor's workflow API.

// WorkflowAddRequest stores a definition: a new workflow or a new version
// of one (runs already started keep the version they started with).
type WorkflowAddRequest struct {
	// Definition is the JSON document (protocol.ParseWorkflowDefinition).
	Definition json.RawMessage `json:"definition"`
}

// WorkflowInfo describes a stored definition.
type WorkflowInfo struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Steps       int    `json:"steps"`
	// Revision is the stored version's revision in bucket workflows: it
	// grows with every write to the bucket, not by one per workflow.
	Revision uint64    `json:"revision"`
	Updated  time.Time `json:"updated"`
	// Definition is the whole document (get; not in a list).
	Definition *protocol.WorkflowDefinition `json:"definition,omitempty"`
}

// WorkflowNameRequest names a workflow (get, rm).
type WorkflowNameRequest struct {
	Name string `json:"name"`
}

// WorkflowList is every stored definition, by name.
type WorkflowList struct {
	Workflows []WorkflowInfo `json:"workflows"`
}

// WorkflowRunRequest starts a run of a stored workflow.
type WorkflowRunRequest struct {
	Workflow string `json:"workflow"`
	// Input is the run's input, a JSON value (templates read it as
	// {{input…}}); omitted, null.
	Input json.RawMessage `json:"input,omitempty"`
	// RunID names the run (a token of at most 64 characters); omitted, the
	// supervisor makes one. A second request with the same id starts
	// nothing and answers Duplicate.
	RunID string `json:"run_id,omitempty"`
}

// WorkflowRunResponse answers a run's start.
type WorkflowRunResponse struct {
	RunID string `json:"run_id"`
	// Duplicate is set when a run with this id existed already.
	Duplicate bool   `json:"duplicate,omitempty"`
	Status    string `json:"status"`
}

// Run statuses (WorkflowRunSummary.Status), also those of a step and of a
// fan-out element.
const (
	WorkflowWaiting   = "waiting"
	WorkflowRunning   = "running"
	WorkflowSucceeded = "succeeded"
	WorkflowFailed    = "failed"
	WorkflowSkipped   = "skipped"
	WorkflowCancelled = "cancelled"
)

// WorkflowRunsRequest lists runs, newest first.
type WorkflowRunsRequest struct {
	// Workflow and Status narrow the list; both optional.
	Workflow string `json:"workflow,omitempty"`
	Status   string `json:"status,omitempty"`
	// Limit bounds the list: default 100, at most 1000.
	Limit int `json:"limit,omitempty"`
}

// MaxWorkflowRunsLimit bounds one list of runs.
const MaxWorkflowRunsLimit = 1000

// Validate checks r, naming the bad field.
func (r WorkflowRunsRequest) Validate() error {
	if r.Workflow != "" {
		if err := protocol.ValidateWorkflowName("workflow", r.Workflow); err != nil {
			return protocol.FieldError("workflow", "%v", err)
		}
	}
	switch r.Status {
	case "", WorkflowRunning, WorkflowSucceeded, WorkflowFailed, WorkflowCancelled:
	default:
		return protocol.FieldError("status", "must be running, succeeded, failed or cancelled, got %q", r.Status)
	}
	if r.Limit < 0 || r.Limit > MaxWorkflowRunsLimit {
		return protocol.FieldError("limit", "must be between 0 (the default, 100) and %d, got %d", MaxWorkflowRunsLimit, r.Limit)
	}
	return nil
}

// WorkflowRunSummary is one run in a list.
type WorkflowRunSummary struct {
	RunID    string `json:"run_id"`
	Workflow string `json:"workflow"`
	Status   string `json:"status"`
	// Round counts the run's retries of failed work (retry-failed).
	Round     int        `json:"round,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// FailedSteps and FailedElements count what failed (Failures lists it).
	FailedSteps    int `json:"failed_steps"`
	FailedElements int `json:"failed_elements"`
	// Error says why the run failed as a whole: a start message that could
	// not start it (an unknown workflow, an input that is not JSON), or a
	// state too large to store.
	Error string `json:"error,omitempty"`
	// JobID is the job the run stands for, when it was started as one (a
	// schedule's fire, a start message with Jetfleet-Job-Id): its events
	// report the run's start and end. ScheduleID is the schedule's.
	JobID      string `json:"job_id,omitempty"`
	ScheduleID string `json:"schedule_id,omitempty"`
}

// WorkflowRunIDRequest names a run (get, retry-failed, cancel).
type WorkflowRunIDRequest struct {
	RunID string `json:"run_id"`
}

// WorkflowRunDetail is one run with each step's state and what failed.
type WorkflowRunDetail struct {
	WorkflowRunSummary
	Input json.RawMessage    `json:"input,omitempty"`
	Steps []WorkflowStepView `json:"steps"`
	// Failures lists every failed step and fan-out element: what
	// retry-failed runs again.
	Failures WorkflowFailures `json:"failures"`
}

// WorkflowStepView is one step of a run.
type WorkflowStepView struct {
	Name      string   `json:"name"`
	Kind      string   `json:"kind"`
	Queue     string   `json:"queue"`
	DependsOn []string `json:"depends_on,omitempty"`
	When      string   `json:"when,omitempty"`
	Status    string   `json:"status"`
	// JobID is the step's job (not for a fan-out: its elements' ids are
	// JobID:<index>).
	JobID  string          `json:"job_id"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	Round  int             `json:"round,omitempty"`
	// Elements counts a fan-out's elements by status.
	Elements map[string]int `json:"elements,omitempty"`
	// StartedAt and EndedAt are when the step last started and ended
	// (for a fan-out: its first element's start, its last element's end).
	StartedAt *time.Time `json:"started_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

// WorkflowFailures lists what failed in a run.
type WorkflowFailures struct {
	Steps    []WorkflowStepFailure    `json:"steps,omitempty"`
	Elements []WorkflowElementFailure `json:"elements,omitempty"`
}

// WorkflowStepFailure is a step that failed as a whole.
type WorkflowStepFailure struct {
	Step  string `json:"step"`
	JobID string `json:"job_id"`
	Error string `json:"error"`
}

// WorkflowElementFailure is a fan-out element that failed.
type WorkflowElementFailure struct {
	Step  string          `json:"step"`
	Index int             `json:"index"`
	Item  json.RawMessage `json:"item"`
	JobID string          `json:"job_id"`
	Error string          `json:"error"`
}

// AddWorkflow stores def (a new workflow or a new version of one).
func (c *Client) AddWorkflow(ctx context.Context, def *protocol.WorkflowDefinition) (*WorkflowInfo, error) {
	data, err := json.Marshal(def)
	if err != nil {
		return nil, err
	}
	return c.AddWorkflowDocument(ctx, data)
}

// AddWorkflowDocument stores the JSON definition doc as it is: the
// supervisor refuses unknown fields and names the step and field at fault.
func (c *Client) AddWorkflowDocument(ctx context.Context, doc []byte) (*WorkflowInfo, error) {
	var info WorkflowInfo
	return &info, c.supervisor(ctx, protocol.APIWorkflowAdd, &WorkflowAddRequest{Definition: doc}, &info)
}

// Workflow returns the stored definition of name.
func (c *Client) Workflow(ctx context.Context, name string) (*WorkflowInfo, error) {
	var info WorkflowInfo
	return &info, c.supervisor(ctx, protocol.APIWorkflowGet, &WorkflowNameRequest{Name: name}, &info)
}

// Workflows lists the stored definitions.
func (c *Client) Workflows(ctx context.Context) ([]WorkflowInfo, error) {
	res := WorkflowList{Workflows: []WorkflowInfo{}}
	return res.Workflows, c.supervisor(ctx, protocol.APIWorkflowList, struct{}{}, &res)
}

// RemoveWorkflow removes the definition of name; its runs go on.
func (c *Client) RemoveWorkflow(ctx context.Context, name string) error {
	return c.supervisor(ctx, protocol.APIWorkflowRemove, &WorkflowNameRequest{Name: name}, nil)
}

// RunOption sets one property of a workflow run's start.
type RunOption func(*WorkflowRunRequest)

// RunID names the run: a second start with the same id starts nothing.
func RunID(id string) RunOption { return func(r *WorkflowRunRequest) { r.RunID = id } }

// RunWorkflow starts a run of the stored workflow name with input (encoded
// as JSON; nil for none; a json.RawMessage for a document already encoded).
func (c *Client) RunWorkflow(ctx context.Context, name string, input any, opts ...RunOption) (*WorkflowRunResponse, error) {
	req := WorkflowRunRequest{Workflow: name}
	if input != nil {
		data, err := json.Marshal(input)
		if err != nil {
			return nil, fmt.Errorf("run input: %w", err)
		}
		req.Input = data
	}
	for _, o := range opts {
		o(&req)
	}
	var res WorkflowRunResponse
	return &res, c.supervisor(ctx, protocol.APIWorkflowRun, &req, &res)
}

// WorkflowRuns lists runs, newest first.
func (c *Client) WorkflowRuns(ctx context.Context, req WorkflowRunsRequest) ([]WorkflowRunSummary, error) {
	res := struct {
		Runs []WorkflowRunSummary `json:"runs"`
	}{Runs: []WorkflowRunSummary{}}
	return res.Runs, c.supervisor(ctx, protocol.APIWorkflowRuns, &req, &res)
}

// WorkflowRun returns one run with its steps and failures.
func (c *Client) WorkflowRun(ctx context.Context, runID string) (*WorkflowRunDetail, error) {
	var res WorkflowRunDetail
	return &res, c.supervisor(ctx, protocol.APIWorkflowRunGet, &WorkflowRunIDRequest{RunID: runID}, &res)
}

// RetryFailedWorkflowRun runs again only what failed in a run (its failed
// fan-out elements and steps, as new jobs), then everything downstream of
// them, so a fan-in sees the full picture.
func (c *Client) RetryFailedWorkflowRun(ctx context.Context, runID string) (*WorkflowRunDetail, error) {
	var res WorkflowRunDetail
	return &res, c.supervisor(ctx, protocol.APIWorkflowRetryFailed, &WorkflowRunIDRequest{RunID: runID}, &res)
}

// CancelWorkflowRun cancels a run: its queued and running jobs are
// cancelled and nothing more starts.
func (c *Client) CancelWorkflowRun(ctx context.Context, runID string) (*WorkflowRunDetail, error) {
	var res WorkflowRunDetail
	return &res, c.supervisor(ctx, protocol.APIWorkflowCancel, &WorkflowRunIDRequest{RunID: runID}, &res)
}

// WaitWorkflowRun returns the run once it has ended (succeeded, failed or
// cancelled), or ctx's error. It asks the supervisor when one of the run's
// workflow events is stored (docs/protocol.md §8.4) and, in case none comes,
// every poll interval (250 ms, growing to 2 s); each ask is bounded by 10 s.
// A run not found yet is waited for too — its start message may not have
// been taken yet — and so is a supervisor that does not answer for a moment
// (unavailable: a leader change); so bound ctx.
func (c *Client) WaitWorkflowRun(ctx context.Context, runID string) (*WorkflowRunDetail, error) {
	if err := protocol.ValidateWorkflowName("run id", runID); err != nil {
		return nil, protocol.FieldError("run_id", "%v", err)
	}
	changed, stop := c.watchWorkflowRun(ctx, runID)
	defer stop()
	const soon = 20 * time.Millisecond // an end event is published just before the run is stored as ended
	interval := 250 * time.Millisecond
	for {
		askCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		run, err := c.WorkflowRun(askCtx, runID)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, protocol.Code(protocol.CodeNotFound)), errors.Is(err, protocol.Code(protocol.CodeUnavailable)),
			errors.Is(err, context.DeadlineExceeded):
		case err != nil:
			return nil, err
		case run.EndedAt != nil:
			return run, nil
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-changed:
			t.Stop()
			interval = soon
		case <-t.C:
			interval = min(2*interval, 2*time.Second)
		}
	}
}

// watchWorkflowRun signals on changed when a workflow event of the run is
// stored. Without read access to EVENTS it never signals, and
// WaitWorkflowRun polls.
func (c *Client) watchWorkflowRun(ctx context.Context, runID string) (changed <-chan struct{}, stop func()) {
	signal := make(chan struct{}, 1)
	cons, err := c.js.OrderedConsumer(ctx, protocol.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.WorkflowEventSubject("*", "*", runID)},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return signal, func() {}
	}
	cc, err := cons.Consume(func(jetstream.Msg) {
		select {
		case signal <- struct{}{}:
		default: // one signal pending is enough: the next ask sees everything
		}
	})
	if err != nil {
		return signal, func() {}
	}
	return signal, cc.Stop
}
