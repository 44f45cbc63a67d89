package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A workflow definition names steps, each a job kind on a queue, and the
// dependencies between them (a DAG). A fan-out step runs one job per element
// of a list; a step that depends on it receives the elements that succeeded
// and those that failed, with their errors. Steps with When "on_failure" run
// only when something upstream failed, "always" in any case.
//
// This file holds the definition, its validation and the input templates.
// The supervisor component that runs workflows builds on it (issue 19); until
// it lands, nothing stores or runs a definition.

// WorkflowDefinition is the JSON document of one workflow.
type WorkflowDefinition struct {
	Name        string         `json:"name"`
	Description string         `json:"description,omitempty"`
	Steps       []WorkflowStep `json:"steps"`
}

// WorkflowStep is one node of the graph.
type WorkflowStep struct {
	Name string `json:"name"`
	// Kind and Queue are those of the step's jobs; Queue defaults to "default".
	Kind  string `json:"kind"`
	Queue string `json:"queue,omitempty"`
	// DependsOn names the steps that must end before this one starts.
	DependsOn []string `json:"depends_on,omitempty"`
	// When says which outcome of the steps upstream lets this step run:
	// "" or "success" (all succeeded; a fan-out with on_element_failure
	// "continue" counts as succeeded), "on_failure" (any failed) or "always".
	When string `json:"when,omitempty"`
	// Input is the payload of the step's jobs, a JSON value whose strings may
	// hold templates (WorkflowTemplate); omitted, the job's payload is the
	// run's input.
	Input json.RawMessage `json:"input,omitempty"`
	// ForEach makes this a fan-out step: a template that yields a list, or a
	// literal JSON list; one job per element, with item and index in scope.
	ForEach json.RawMessage `json:"for_each,omitempty"`
	// Parallelism bounds the fan-out's jobs queued or running at once; zero
	// means all at once.
	Parallelism int `json:"parallelism,omitempty"`
	// OnElementFailure is "continue" (the default: the other elements run and
	// the step succeeds with its failures listed) or "fail_fast" (the first
	// failure fails the step and cancels the elements not yet ended).
	OnElementFailure string `json:"on_element_failure,omitempty"`
	// Timeout, Attempts and Backoff are the jobs' (docs/protocol.md §2.2);
	// zero values leave the agent's defaults.
	Timeout  string   `json:"timeout,omitempty"`
	Attempts int      `json:"attempts,omitempty"`
	Backoff  []string `json:"backoff,omitempty"`
}

// Values of WorkflowStep.When and WorkflowStep.OnElementFailure.
const (
	WhenSuccess   = "success"
	WhenOnFailure = "on_failure"
	WhenAlways    = "always"

	ElementFailureContinue = "continue"
	ElementFailureFailFast = "fail_fast"
)

// Bounds of a definition: a definition is one key-value entry, and a run's
// state holds one record per step. Step names and run ids are shorter than
// other tokens so that the longest step job id,
// wf:<run>:<step>:<element>~<round>, stays within MaxJobIDLength.
const (
	MaxWorkflowSteps      = 100
	MaxWorkflowDefSize    = 256 << 10
	MaxWorkflowNameLength = 64
)

// ValidateWorkflowName checks a workflow, step or run name: a token
// (ValidateToken) of at most MaxWorkflowNameLength characters.
func ValidateWorkflowName(what, s string) error {
	if err := ValidateToken(what, s); err != nil {
		return err
	}
	if len(s) > MaxWorkflowNameLength {
		return fmt.Errorf("invalid %s %q: at most %d characters", what, s, MaxWorkflowNameLength)
	}
	return nil
}

// ParseWorkflowDefinition decodes and validates a definition; unknown fields
// are refused, and every error names the step and the field.
func ParseWorkflowDefinition(data []byte) (*WorkflowDefinition, error) {
	if len(data) > MaxWorkflowDefSize {
		return nil, fmt.Errorf("workflow definition of %d bytes is over the limit of %d", len(data), MaxWorkflowDefSize)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var def WorkflowDefinition
	if err := dec.Decode(&def); err != nil {
		return nil, fmt.Errorf("workflow definition: %w", err)
	}
	if dec.More() {
		return nil, errors.New("workflow definition: more than one JSON document")
	}
	if err := def.Validate(); err != nil {
		return nil, err
	}
	return &def, nil
}

// Step returns the step called name.
func (d *WorkflowDefinition) Step(name string) (WorkflowStep, bool) {
	for _, s := range d.Steps {
		if s.Name == name {
			return s, true
		}
	}
	return WorkflowStep{}, false
}

// Validate checks the definition as a whole: names, fields, that every
// dependency exists, that the graph has no cycle, and that every template
// reads only the run, its input, its element (in a fan-out) and results of
// steps upstream of it. Errors name the step and the field.
func (d *WorkflowDefinition) Validate() error {
	var errs []error
	if err := ValidateWorkflowName("workflow name", d.Name); err != nil {
		errs = append(errs, fmt.Errorf("name: %w", err))
	}
	switch {
	case len(d.Steps) == 0:
		errs = append(errs, errors.New("steps: a workflow needs at least one step"))
	case len(d.Steps) > MaxWorkflowSteps:
		errs = append(errs, fmt.Errorf("steps: %d steps are over the limit of %d", len(d.Steps), MaxWorkflowSteps))
	}
	seen := map[string]bool{}
	for i, s := range d.Steps {
		if seen[s.Name] {
			errs = append(errs, fmt.Errorf("steps[%d]: a second step called %q", i, s.Name))
		}
		seen[s.Name] = true
	}
	for i, s := range d.Steps {
		for _, err := range s.validateFields(seen) {
			errs = append(errs, fmt.Errorf("step %s: %w", stepLabel(i, s.Name), err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if cycle := d.cycle(); cycle != nil {
		return fmt.Errorf("depends_on: the steps form a cycle: %s", strings.Join(cycle, " → "))
	}
	for _, s := range d.Steps {
		upstream := d.Upstream(s.Name)
		check := func(field string, raw json.RawMessage) {
			if err := validateTemplates(raw, s, upstream, d); err != nil {
				errs = append(errs, fmt.Errorf("step %s: %s: %w", s.Name, field, err))
			}
		}
		check("input", s.Input)
		// The list is built before there is an element: for_each reads no item.
		listStep := s
		listStep.ForEach = nil
		if err := validateTemplates(s.ForEach, listStep, upstream, d); err != nil {
			errs = append(errs, fmt.Errorf("step %s: for_each: %w", s.Name, err))
		}
	}
	return errors.Join(errs...)
}

func stepLabel(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("steps[%d]", i)
	}
	return name
}

// validateFields checks one step on its own; steps holds every step name.
func (s WorkflowStep) validateFields(steps map[string]bool) []error {
	var errs []error
	if err := ValidateWorkflowName("step name", s.Name); err != nil {
		errs = append(errs, fmt.Errorf("name: %w", err))
	}
	if err := ValidateToken("kind", s.Kind); err != nil {
		errs = append(errs, fmt.Errorf("kind: %w", err))
	}
	if s.Queue != "" {
		if err := ValidateToken("queue", s.Queue); err != nil {
			errs = append(errs, fmt.Errorf("queue: %w", err))
		}
	}
	for _, dep := range s.DependsOn {
		switch {
		case dep == s.Name:
			errs = append(errs, fmt.Errorf("depends_on: the step depends on itself"))
		case !steps[dep]:
			errs = append(errs, fmt.Errorf("depends_on: no step called %q", dep))
		}
	}
	switch s.When {
	case "", WhenSuccess, WhenAlways:
	case WhenOnFailure:
		if len(s.DependsOn) == 0 {
			errs = append(errs, errors.New("when: an on_failure step needs depends_on: the steps whose failure it handles"))
		}
	default:
		errs = append(errs, fmt.Errorf("when: %q is not success, on_failure or always", s.When))
	}
	if len(s.Input) > 0 && !json.Valid(s.Input) {
		errs = append(errs, errors.New("input: not a JSON value"))
	}
	if len(s.ForEach) > 0 {
		if err := validateForEach(s.ForEach); err != nil {
			errs = append(errs, fmt.Errorf("for_each: %w", err))
		}
	} else {
		if s.Parallelism != 0 {
			errs = append(errs, errors.New("parallelism: only a fan-out step (for_each) has one"))
		}
		if s.OnElementFailure != "" {
			errs = append(errs, errors.New("on_element_failure: only a fan-out step (for_each) has one"))
		}
	}
	if s.Parallelism < 0 {
		errs = append(errs, fmt.Errorf("parallelism: %d is negative", s.Parallelism))
	}
	switch s.OnElementFailure {
	case "", ElementFailureContinue, ElementFailureFailFast:
	default:
		errs = append(errs, fmt.Errorf("on_element_failure: %q is not continue or fail_fast", s.OnElementFailure))
	}
	if s.Timeout != "" {
		if d, err := time.ParseDuration(s.Timeout); err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("timeout: %q is not a positive duration such as 30s", s.Timeout))
		}
	}
	if s.Attempts < 0 {
		errs = append(errs, fmt.Errorf("attempts: %d is negative", s.Attempts))
	}
	for i, b := range s.Backoff {
		if d, err := time.ParseDuration(b); err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("backoff[%d]: %q is not a duration such as 30s", i, b))
		}
	}
	return errs
}

// validateForEach accepts a literal JSON list or a string that is exactly
// one template expression; anything else cannot yield a list.
func validateForEach(raw json.RawMessage) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return errors.New("not a JSON value")
	}
	switch v := v.(type) {
	case []any:
		return nil
	case string:
		if _, ok := wholeTemplate(v); !ok {
			return fmt.Errorf("%q is neither a list nor one template such as \"{{input.files}}\"", v)
		}
		return nil
	default:
		return fmt.Errorf("%s is not a list", strings.TrimSpace(string(raw)))
	}
}

// cycle returns the steps of one cycle of the graph, nil when it has none.
func (d *WorkflowDefinition) cycle() []string {
	const (
		unvisited = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(name string) []string
	visit = func(name string) []string {
		switch state[name] {
		case onPath:
			start := slices.Index(path, name)
			return append(slices.Clone(path[start:]), name)
		case done:
			return nil
		}
		state[name] = onPath
		path = append(path, name)
		s, _ := d.Step(name)
		for _, dep := range s.DependsOn {
			if c := visit(dep); c != nil {
				return c
			}
		}
		path = path[:len(path)-1]
		state[name] = done
		return nil
	}
	for _, s := range d.Steps {
		if c := visit(s.Name); c != nil {
			slices.Reverse(c) // read in the direction the work flows
			return c
		}
	}
	return nil
}

// Upstream returns every step the named step depends on, directly or not.
func (d *WorkflowDefinition) Upstream(name string) map[string]bool {
	out := map[string]bool{}
	var walk func(string)
	walk = func(n string) {
		s, _ := d.Step(n)
		for _, dep := range s.DependsOn {
			if !out[dep] {
				out[dep] = true
				walk(dep)
			}
		}
	}
	walk(name)
	return out
}

// Roots are the steps that depend on nothing: a run starts with them.
func (d *WorkflowDefinition) Roots() []string {
	var out []string
	for _, s := range d.Steps {
		if len(s.DependsOn) == 0 {
			out = append(out, s.Name)
		}
	}
	return out
}

// IsFanOut says whether the step runs one job per element.
func (s WorkflowStep) IsFanOut() bool { return len(s.ForEach) > 0 }

// QueueOrDefault is the queue of the step's jobs.
func (s WorkflowStep) QueueOrDefault() string {
	if s.Queue == "" {
		return "default"
	}
	return s.Queue
}

// WorkflowRunOfJob returns the run id of a step's job id (WorkflowStepJobID),
// and false for a job that is not a workflow step's.
func WorkflowRunOfJob(jobID string) (string, bool) {
	rest, ok := strings.CutPrefix(jobID, "wf:")
	if !ok {
		return "", false
	}
	run, _, ok := strings.Cut(rest, ":")
	return run, ok && run != ""
}

// WorkflowStepJobID is the job id of a step's job in a run: deterministic,
// so that a supervisor that takes over mid-run publishes the same ids and
// JetStream's duplicate window and the job's recorded events keep each
// step, and each element, to one execution. element is -1 for a step that
// is not a fan-out; round counts the run's retries of failed work (0 for
// the first execution), so that a retry is a new job.
func WorkflowStepJobID(runID, step string, element, round int) string {
	id := "wf:" + runID + ":" + step
	if element >= 0 {
		id += ":" + strconv.Itoa(element)
	}
	if round > 0 {
		id += "~" + strconv.Itoa(round)
	}
	return id
}
