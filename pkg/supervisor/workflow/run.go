// Package workflow is the state machine of a workflow run: given the run's
// state and a job's outcome, it says what to do next (publish the next jobs,
// cancel the rest of a failing fan-out, raise the run's one alert, end the
// run). It does no I/O: the supervisor's workflow component stores the state
// in JetStream and carries out the actions, so that a leader that takes over
// mid-run resumes from the stored state and the deterministic job ids keep
// every step and element to one execution (issue 19; definitions and
// templates are in pkg/protocol).
package workflow

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Status is the state of a run, a step or a fan-out element.
type Status string

// Statuses. A step waits for its dependencies, runs, and ends succeeded,
// failed, skipped (its condition did not hold) or cancelled.
const (
	StatusWaiting   Status = "waiting"
	StatusRunning   Status = "running"
	StatusSucceeded Status = "succeeded"
	StatusFailed    Status = "failed"
	StatusSkipped   Status = "skipped"
	StatusCancelled Status = "cancelled"
)

// Ended says whether s is final (until a retry of failed work).
func (s Status) Ended() bool {
	return s == StatusSucceeded || s == StatusFailed || s == StatusSkipped || s == StatusCancelled
}

// Run is the whole state of one run: what the supervisor stores.
type Run struct {
	ID       string                      `json:"id"`
	Workflow string                      `json:"workflow"`
	Def      protocol.WorkflowDefinition `json:"definition"` // as it was when the run started
	Input    json.RawMessage             `json:"input,omitempty"`
	Status   Status                      `json:"status"`
	// Round counts retries of failed work (RetryFailed); job ids carry it.
	Round int                   `json:"round,omitempty"`
	Steps map[string]*StepState `json:"steps"`
	// Error says why a run failed as a whole (Abort).
	Error string `json:"error,omitempty"`
	// Trigger is the job id the run was started as, when one stands for it
	// (a schedule's fire, a start message with Jetfleet-Job-Id): the
	// supervisor reports the run's start and end as that job's events.
	Trigger *Trigger `json:"trigger,omitempty"`
	// TraceParent is the W3C trace context of the run's root span: every
	// step's job carries it, so that a run is one trace.
	TraceParent string `json:"traceparent,omitempty"`
	// StartedAt, UpdatedAt and EndedAt are kept by the supervisor, on its
	// clock; EndedAt is nil while the run runs.
	StartedAt time.Time  `json:"started_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

// Trigger is what a run stands for as a job.
type Trigger struct {
	JobID       string `json:"job_id"`
	ScheduleID  string `json:"schedule_id,omitempty"`
	NominalTime string `json:"nominal_time,omitempty"` // as the start message had it (RFC 3339)
}

// StepState is one step of a run.
type StepState struct {
	Status Status          `json:"status"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
	// SkippedForFailure marks a step skipped because something upstream
	// failed: an on_failure step downstream of it still runs.
	SkippedForFailure bool `json:"skipped_for_failure,omitempty"`
	// Round is the run's round in which the step last started.
	Round int `json:"round,omitempty"`
	// Items and Elements are a fan-out's list and each element's state.
	Items    []json.RawMessage `json:"items,omitempty"`
	Elements []ElementState    `json:"elements,omitempty"`
	// StartedAt and EndedAt are when the step last started and ended, set
	// by the supervisor as it stores the transition (the step's duration).
	StartedAt *time.Time `json:"started_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
}

// ElementState is one element of a fan-out.
type ElementState struct {
	Status Status          `json:"status"`
	Round  int             `json:"round,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// Outcome is how a step's job ended, from its last job event.
type Outcome struct {
	Status Status          // StatusSucceeded, StatusFailed (dead) or StatusCancelled
	Result json.RawMessage // with StatusSucceeded
	Error  string          // with StatusFailed or StatusCancelled
}

// Actions are what the caller must do after a transition, in order.
type Actions struct {
	Publish []Job    // jobs to publish (their ids are deterministic: publishing twice is harmless)
	Cancel  []string // job ids to cancel
	// Alert, when set, is the run's one alert: every failed step and element.
	Alert *Failures
	// Ended is set when the run reached its end in this transition.
	Ended bool
}

// Job is one job to publish for a step.
type Job struct {
	ID       string
	Step     string
	Element  int // -1 for a step that is not a fan-out
	Queue    string
	Kind     string
	Payload  json.RawMessage
	Timeout  time.Duration
	Attempts int
	Backoff  []time.Duration
}

// Failures lists what failed in a run, for its alert and for the operator.
type Failures struct {
	Steps    []StepFailure    `json:"steps,omitempty"`
	Elements []ElementFailure `json:"elements,omitempty"`
}

// StepFailure is a step that failed as a whole.
type StepFailure struct {
	Step  string `json:"step"`
	Error string `json:"error"`
}

// ElementFailure is a fan-out element that failed.
type ElementFailure struct {
	Step  string          `json:"step"`
	Index int             `json:"index"`
	Item  json.RawMessage `json:"item"`
	Error string          `json:"error"`
}

// Empty says whether nothing failed.
func (f Failures) Empty() bool { return len(f.Steps) == 0 && len(f.Elements) == 0 }

// Summary says what failed: "2 elements failed", "1 step and 3 elements
// failed"; "no step or element failed" when none did (a run ended by an
// error of its own, Run.Error).
func (f Failures) Summary() string {
	if f.Empty() {
		return "no step or element failed"
	}
	counted := func(n int, noun string) string {
		if n == 1 {
			return "1 " + noun
		}
		return fmt.Sprintf("%d %ss", n, noun)
	}
	switch {
	case len(f.Steps) > 0 && len(f.Elements) > 0:
		return counted(len(f.Steps), "step") + " and " + counted(len(f.Elements), "element") + " failed"
	case len(f.Elements) > 0:
		return counted(len(f.Elements), "element") + " failed"
	}
	return counted(len(f.Steps), "step") + " failed"
}

// Start creates a run of def and returns the jobs of its first steps.
func Start(def protocol.WorkflowDefinition, runID string, input json.RawMessage) (*Run, Actions, error) {
	if err := def.Validate(); err != nil {
		return nil, Actions{}, err
	}
	if err := protocol.ValidateWorkflowName("run id", runID); err != nil {
		return nil, Actions{}, err
	}
	if len(input) == 0 {
		input = json.RawMessage("null")
	}
	if !json.Valid(input) {
		return nil, Actions{}, errors.New("run input: not a JSON value")
	}
	r := &Run{ID: runID, Workflow: def.Name, Def: def, Input: input, Status: StatusRunning,
		Steps: make(map[string]*StepState, len(def.Steps))}
	for _, s := range def.Steps {
		r.Steps[s.Name] = &StepState{Status: StatusWaiting}
	}
	var acts Actions
	r.advance(&acts)
	return r, acts, nil
}

// JobEnded records the outcome of one of the run's jobs and returns what
// follows. An outcome for a job the run does not wait for (a duplicate
// event, a job of an earlier round) changes nothing.
func (r *Run) JobEnded(jobID string, out Outcome) (Actions, error) {
	var acts Actions
	step, element, round, err := r.parseJobID(jobID)
	if err != nil {
		return acts, err
	}
	switch out.Status {
	case StatusSucceeded, StatusFailed, StatusCancelled:
	default:
		return acts, fmt.Errorf("job %s: %q is not an outcome", jobID, out.Status)
	}
	st := r.Steps[step]
	if element < 0 {
		if st.Status != StatusRunning || st.Round != round {
			return acts, nil
		}
		st.Status, st.Result, st.Error = out.Status, out.Result, out.Error
		r.advance(&acts)
		return acts, nil
	}
	if element >= len(st.Elements) {
		return acts, nil // an element of an earlier round's list, since reset
	}
	el := &st.Elements[element]
	if el.Status != StatusRunning || el.Round != round {
		return acts, nil
	}
	el.Status, el.Result, el.Error = out.Status, out.Result, out.Error
	def, _ := r.Def.Step(step)
	if out.Status != StatusSucceeded && def.OnElementFailure == protocol.ElementFailureFailFast {
		r.failFast(step, st, &acts)
	}
	r.fillFanOut(step, st, &acts)
	r.advance(&acts)
	return acts, nil
}

// JobOutcome is one job's outcome, for JobsEnded.
type JobOutcome struct {
	JobID   string
	Outcome Outcome
}

// JobsEnded records the outcomes of a batch of events at once, in order,
// and returns what follows; changed says whether any outcome applied, and
// errs names the jobs the run does not know (skipped). It comes to what
// JobEnded for each in turn would, with each fan-out topped up and the run
// advanced once, at the end, instead of after every outcome: a batch of a
// large fan-out's events costs one pass over its elements, not one per
// event. Except when an outcome is for a job that the deferred work would
// start (a leader that died after publishing the next jobs and before
// storing the run leaves their outcomes in the same batch as the events
// that started them): that work is done first, as JobEnded would have.
func (r *Run) JobsEnded(outs []JobOutcome) (acts Actions, changed bool, errs []error) {
	var pending []string // fan-outs to top up, then advance
	settle := func() {
		for _, step := range pending {
			r.fillFanOut(step, r.Steps[step], &acts)
		}
		if len(pending) > 0 {
			r.advance(&acts)
		}
		pending = pending[:0]
	}
	for _, o := range outs {
		step, element, round, err := r.parseJobID(o.JobID)
		if err == nil {
			switch o.Outcome.Status {
			case StatusSucceeded, StatusFailed, StatusCancelled:
			default:
				err = fmt.Errorf("job %s: %q is not an outcome", o.JobID, o.Outcome.Status)
			}
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		st := r.Steps[step]
		if element < 0 {
			if st.Status == StatusWaiting {
				settle()
			}
			if st.Status == StatusRunning && st.Round == round {
				settle()
				more, _ := r.JobEnded(o.JobID, o.Outcome)
				acts.merge(more)
				changed = true
			}
			continue
		}
		if element < len(st.Elements) && st.Elements[element].Status == StatusWaiting || st.Status == StatusWaiting {
			settle()
		}
		if element >= len(st.Elements) {
			continue
		}
		el := &st.Elements[element]
		if el.Status != StatusRunning || el.Round != round {
			continue
		}
		el.Status, el.Result, el.Error = o.Outcome.Status, o.Outcome.Result, o.Outcome.Error
		changed = true
		def, _ := r.Def.Step(step)
		if o.Outcome.Status != StatusSucceeded && def.OnElementFailure == protocol.ElementFailureFailFast {
			r.failFast(step, st, &acts)
		}
		if !slices.Contains(pending, step) {
			pending = append(pending, step)
		}
	}
	settle()
	return acts, changed, errs
}

// merge appends more's actions to a's.
func (a *Actions) merge(more Actions) {
	a.Publish = append(a.Publish, more.Publish...)
	a.Cancel = append(a.Cancel, more.Cancel...)
	if more.Alert != nil {
		a.Alert = more.Alert
	}
	a.Ended = a.Ended || more.Ended
}

// Cancel ends a running run: its queued and running jobs are cancelled and
// its steps not yet ended are marked cancelled.
func (r *Run) Cancel() Actions {
	var acts Actions
	if r.Status != StatusRunning {
		return acts
	}
	for _, s := range r.Def.Steps {
		st := r.Steps[s.Name]
		if st.Status.Ended() {
			continue
		}
		if st.Status == StatusRunning {
			if s.IsFanOut() {
				for i := range st.Elements {
					if st.Elements[i].Status == StatusRunning {
						acts.Cancel = append(acts.Cancel, protocol.WorkflowStepJobID(r.ID, s.Name, i, st.Elements[i].Round))
					}
					if !st.Elements[i].Status.Ended() {
						st.Elements[i].Status, st.Elements[i].Error = StatusCancelled, "the run was cancelled"
					}
				}
			} else {
				acts.Cancel = append(acts.Cancel, protocol.WorkflowStepJobID(r.ID, s.Name, -1, st.Round))
			}
		}
		st.Status, st.Error = StatusCancelled, "the run was cancelled"
	}
	r.Status = StatusCancelled
	acts.Ended = true
	return acts
}

// Abort fails a running run as a whole for reason (a state the supervisor
// cannot store): its queued and running jobs are cancelled, like Cancel's,
// and the run ends failed with reason as its error and its one alert.
func (r *Run) Abort(reason string) Actions {
	if r.Status != StatusRunning {
		return Actions{}
	}
	acts := r.Cancel()
	r.Status, r.Error = StatusFailed, reason
	f := r.Failures()
	f.Steps = append(f.Steps, StepFailure{Step: "(run)", Error: reason})
	acts.Alert = &f
	return acts
}

// RetryFailed runs again, in a new round, the failed steps and fan-out
// elements of an ended run and every step downstream of them, so that a
// fan-in sees the whole picture once the retried work succeeds. Work that
// succeeded stands.
func (r *Run) RetryFailed() (Actions, error) {
	var acts Actions
	if r.Status == StatusRunning {
		return acts, errors.New("the run is still running")
	}
	r.Round++
	retried := map[string]bool{}
	for _, s := range r.Def.Steps {
		st := r.Steps[s.Name]
		failedElements := false
		for i := range st.Elements {
			if st.Elements[i].Status == StatusFailed || st.Elements[i].Status == StatusCancelled {
				st.Elements[i] = ElementState{Status: StatusWaiting}
				failedElements = true
			}
		}
		if st.Status == StatusFailed || st.Status == StatusCancelled || failedElements {
			retried[s.Name] = true
		}
	}
	if len(retried) == 0 {
		r.Round--
		return acts, errors.New("nothing failed in this run")
	}
	for _, s := range r.Def.Steps {
		st := r.Steps[s.Name]
		downstream := false
		for name := range retried {
			if r.Def.Upstream(s.Name)[name] {
				downstream = true
			}
		}
		switch {
		case downstream:
			// What it read may change: it runs again from its start.
			*st = StepState{Status: StatusWaiting}
		case retried[s.Name] && s.IsFanOut() && st.Items != nil:
			// Its list stands, and so do its elements that succeeded; the
			// failed ones wait to go out again.
			st.Status, st.Round, st.Error = StatusRunning, r.Round, ""
		case retried[s.Name]:
			*st = StepState{Status: StatusWaiting}
		}
	}
	r.Status, r.Error, r.EndedAt = StatusRunning, "", nil
	for _, s := range r.Def.Steps {
		if st := r.Steps[s.Name]; st.Status == StatusRunning && s.IsFanOut() {
			r.fillFanOut(s.Name, st, &acts)
		}
	}
	r.advance(&acts)
	return acts, nil
}

// Failures lists what failed in the run so far: steps and elements that
// failed or were cancelled (a job cancelled on its own, or by fail_fast).
func (r *Run) Failures() Failures {
	var f Failures
	for _, s := range r.Def.Steps {
		st := r.Steps[s.Name]
		for i, el := range st.Elements {
			if el.Status == StatusFailed || el.Status == StatusCancelled {
				f.Elements = append(f.Elements, ElementFailure{Step: s.Name, Index: i, Item: st.Items[i], Error: el.Error})
			}
		}
		if st.Status == StatusFailed || st.Status == StatusCancelled {
			f.Steps = append(f.Steps, StepFailure{Step: s.Name, Error: st.Error})
		}
	}
	return f
}

// advance starts every step whose dependencies have ended, skips those
// whose condition does not hold, and ends the run when every step has.
func (r *Run) advance(acts *Actions) {
	for progress := true; progress; {
		progress = false
		for _, s := range r.Def.Steps {
			st := r.Steps[s.Name]
			if st.Status != StatusWaiting || !r.depsEnded(s) {
				continue
			}
			progress = true
			run, forFailure := r.condition(s)
			if !run {
				st.Status, st.SkippedForFailure = StatusSkipped, forFailure
				continue
			}
			r.startStep(s, st, acts)
		}
	}
	if r.Status != StatusRunning {
		return
	}
	for _, st := range r.Steps {
		if !st.Status.Ended() {
			return
		}
	}
	r.Status = StatusSucceeded
	if f := r.Failures(); !f.Empty() {
		r.Status = StatusFailed
		acts.Alert = &f
	}
	acts.Ended = true
}

func (r *Run) depsEnded(s protocol.WorkflowStep) bool {
	for _, dep := range s.DependsOn {
		if !r.Steps[dep].Status.Ended() {
			return false
		}
	}
	return true
}

// condition says whether a step whose dependencies ended runs, and when it
// does not, whether that is because something upstream failed.
func (r *Run) condition(s protocol.WorkflowStep) (run, forFailure bool) {
	failedUpstream, allSucceeded := false, true
	for _, dep := range s.DependsOn {
		st := r.Steps[dep]
		if st.Status == StatusFailed || st.Status == StatusCancelled || (st.Status == StatusSkipped && st.SkippedForFailure) ||
			st.failedElements() > 0 {
			failedUpstream = true // a fan-out that went on past failed elements counts for on_failure steps
		}
		if st.Status != StatusSucceeded {
			allSucceeded = false
		}
	}
	switch s.When {
	case protocol.WhenAlways:
		return true, false
	case protocol.WhenOnFailure:
		return failedUpstream, false
	default:
		return allSucceeded, failedUpstream
	}
}

// startStep renders a step's input (or its list, for a fan-out) and
// publishes its first jobs; a template that cannot be rendered fails the
// step with the reason.
func (r *Run) startStep(s protocol.WorkflowStep, st *StepState, acts *Actions) {
	st.Status, st.Round = StatusRunning, r.Round
	if !s.IsFanOut() {
		job, err := r.job(s, -1, r.Round, nil)
		if err != nil {
			st.Status, st.Error = StatusFailed, err.Error()
			return
		}
		acts.Publish = append(acts.Publish, job)
		return
	}
	items, err := protocol.RenderForEach(s.ForEach, r.scope(s, false))
	if err != nil {
		st.Status, st.Error = StatusFailed, err.Error()
		return
	}
	st.Items = make([]json.RawMessage, len(items))
	st.Elements = make([]ElementState, len(items))
	for i, item := range items {
		b, err := json.Marshal(item)
		if err != nil {
			st.Status, st.Error = StatusFailed, fmt.Sprintf("for_each element %d: %v", i, err)
			return
		}
		st.Items[i] = b
		st.Elements[i] = ElementState{Status: StatusWaiting}
	}
	r.fillFanOut(s.Name, st, acts)
}

// fillFanOut publishes waiting elements up to the step's parallelism, and
// ends the step once every element has.
func (r *Run) fillFanOut(name string, st *StepState, acts *Actions) {
	if st.Status != StatusRunning {
		return
	}
	s, _ := r.Def.Step(name)
	running, ended, failed := 0, 0, 0
	for _, el := range st.Elements {
		switch {
		case el.Status == StatusRunning:
			running++
		case el.Status.Ended():
			ended++
			if el.Status != StatusSucceeded {
				failed++
			}
		}
	}
	var inputs *protocol.WorkflowInputs // prepared once for every element this fill starts
	for i := range st.Elements {
		if s.Parallelism > 0 && running >= s.Parallelism {
			break
		}
		el := &st.Elements[i]
		if el.Status != StatusWaiting {
			continue
		}
		var err error
		if inputs == nil {
			inputs, err = r.inputs(s, true)
		}
		var job Job
		if err == nil {
			job, err = r.job(s, i, r.Round, inputs)
		}
		if err != nil {
			el.Status, el.Error = StatusFailed, err.Error()
			if s.OnElementFailure == protocol.ElementFailureFailFast {
				r.failFast(name, st, acts)
				st.Status, st.Error = StatusFailed, fmt.Sprintf("element %d: %v", i, err)
				return
			}
			ended++
			failed++
			continue
		}
		el.Status, el.Round = StatusRunning, r.Round
		acts.Publish = append(acts.Publish, job)
		running++
	}
	if ended < len(st.Elements) {
		return
	}
	if failed > 0 && s.OnElementFailure == protocol.ElementFailureFailFast {
		n := 0
		for _, el := range st.Elements {
			if el.Status == StatusFailed {
				n++
			}
		}
		st.Status, st.Error = StatusFailed, fmt.Sprintf("%d of %d elements failed, the rest cancelled (fail_fast)", n, len(st.Elements))
		return
	}
	st.Status = StatusSucceeded // failures, if any, are listed with the elements
}

func (st *StepState) failedElements() int {
	n := 0
	for _, el := range st.Elements {
		if el.Status == StatusFailed || el.Status == StatusCancelled {
			n++
		}
	}
	return n
}

// failFast cancels a fan-out's running elements and drops its waiting ones.
func (r *Run) failFast(name string, st *StepState, acts *Actions) {
	for i := range st.Elements {
		el := &st.Elements[i]
		switch el.Status {
		case StatusRunning:
			acts.Cancel = append(acts.Cancel, protocol.WorkflowStepJobID(r.ID, name, i, el.Round))
			el.Status, el.Error = StatusCancelled, "fail_fast: another element failed"
		case StatusWaiting:
			el.Status, el.Error = StatusCancelled, "fail_fast: another element failed"
		}
	}
}

// scope is what a step's templates read: the run, its input, the outcomes
// of the steps upstream and, in a fan-out, the element (given to
// WorkflowInputs.Render).
func (r *Run) scope(s protocol.WorkflowStep, inFanOut bool) protocol.WorkflowScope {
	input, _ := protocol.DecodeJSON(r.Input) // validated by Start
	sc := protocol.WorkflowScope{RunID: r.ID, Workflow: r.Workflow, Input: input, InFanOut: inFanOut,
		Steps: map[string]protocol.WorkflowStepOutcome{}}
	for name := range r.Def.Upstream(s.Name) {
		sc.Steps[name] = r.outcomeOf(name)
	}
	return sc
}

func (r *Run) outcomeOf(name string) protocol.WorkflowStepOutcome {
	st := r.Steps[name]
	out := protocol.WorkflowStepOutcome{Error: st.Error}
	if st.Items != nil {
		out.Succeeded, out.Failed = []protocol.WorkflowElementResult{}, []protocol.WorkflowElementFailure{}
	}
	if len(st.Result) > 0 {
		out.Result, _ = protocol.DecodeJSON(st.Result) // a result is a JSON document (docs/protocol.md §3.10)
	}
	for i, el := range st.Elements {
		item, _ := protocol.DecodeJSON(st.Items[i])
		var result any
		switch el.Status {
		case StatusSucceeded:
			if len(el.Result) > 0 {
				result, _ = protocol.DecodeJSON(el.Result)
			}
			out.Succeeded = append(out.Succeeded, protocol.WorkflowElementResult{Index: i, Item: item, Result: result})
		case StatusFailed, StatusCancelled:
			out.Failed = append(out.Failed, protocol.WorkflowElementFailure{Index: i, Item: item, Error: el.Error})
		}
	}
	return out
}

// inputs prepares the rendering of step s's input in the run's scope.
func (r *Run) inputs(s protocol.WorkflowStep, inFanOut bool) (*protocol.WorkflowInputs, error) {
	inputs, err := protocol.NewWorkflowInputs(s.Input, r.scope(s, inFanOut))
	if err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	return inputs, nil
}

// job builds the job of a step (element -1) or of one element of a fan-out,
// rendering its input with inputs (prepared by r.inputs; nil for a step
// that is not a fan-out, whose scope is prepared here).
func (r *Run) job(s protocol.WorkflowStep, element, round int, inputs *protocol.WorkflowInputs) (Job, error) {
	var item any
	if element >= 0 {
		item, _ = protocol.DecodeJSON(r.Steps[s.Name].Items[element]) // marshalled by startStep
	} else {
		var err error
		if inputs, err = r.inputs(s, false); err != nil {
			return Job{}, err
		}
	}
	payload, err := inputs.Render(item, element)
	if err != nil {
		return Job{}, fmt.Errorf("input: %w", err)
	}
	job := Job{ID: protocol.WorkflowStepJobID(r.ID, s.Name, element, round), Step: s.Name, Element: element,
		Queue: s.QueueOrDefault(), Kind: s.Kind, Payload: payload, Attempts: s.Attempts}
	job.Timeout, _ = time.ParseDuration(s.Timeout) // validated with the definition
	for _, b := range s.Backoff {
		d, _ := time.ParseDuration(b)
		job.Backoff = append(job.Backoff, d)
	}
	return job, nil
}

// parseJobID splits a step job id of this run: wf:<run>:<step>[:<element>][~<round>].
func (r *Run) parseJobID(jobID string) (step string, element, round int, err error) {
	prefix := "wf:" + r.ID + ":"
	rest, ok := strings.CutPrefix(jobID, prefix)
	if !ok {
		return "", 0, 0, fmt.Errorf("job %s is not a job of run %s", jobID, r.ID)
	}
	if base, n, ok := strings.Cut(rest, "~"); ok {
		if round, err = strconv.Atoi(n); err != nil || round <= 0 {
			return "", 0, 0, fmt.Errorf("job %s: bad round %q", jobID, n)
		}
		rest = base
	}
	step, el, isElement := strings.Cut(rest, ":")
	element = -1
	if isElement {
		if element, err = strconv.Atoi(el); err != nil || element < 0 {
			return "", 0, 0, fmt.Errorf("job %s: bad element %q", jobID, el)
		}
	}
	def, ok := r.Def.Step(step)
	switch {
	case !ok:
		return "", 0, 0, fmt.Errorf("job %s: run %s has no step %q", jobID, r.ID, step)
	case def.IsFanOut() != isElement:
		return "", 0, 0, fmt.Errorf("job %s: step %s is %s", jobID, step, map[bool]string{true: "a fan-out", false: "not a fan-out"}[def.IsFanOut()])
	}
	return step, element, round, nil
}

// RunningJobs are the jobs of the run's running steps and elements, as they
// were published: what a supervisor publishes again when it cannot know
// whether an earlier one did (their ids make a second publish harmless).
func (r *Run) RunningJobs() []Job {
	var jobs []Job
	for _, s := range r.Def.Steps {
		st := r.Steps[s.Name]
		if st.Status != StatusRunning {
			continue
		}
		if !s.IsFanOut() {
			if job, err := r.job(s, -1, st.Round, nil); err == nil {
				jobs = append(jobs, job)
			}
			continue
		}
		inputs, err := r.inputs(s, true)
		if err != nil {
			continue // it could not have been published
		}
		for i, el := range st.Elements {
			if el.Status != StatusRunning {
				continue
			}
			if job, err := r.job(s, i, el.Round, inputs); err == nil {
				jobs = append(jobs, job)
			}
		}
	}
	return jobs
}

// StepNames returns the run's steps in definition order.
func (r *Run) StepNames() []string {
	names := make([]string, 0, len(r.Def.Steps))
	for _, s := range r.Def.Steps {
		names = append(names, s.Name)
	}
	return slices.Clip(names)
}
