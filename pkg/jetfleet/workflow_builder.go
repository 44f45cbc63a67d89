package jetfleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// WorkflowBuilder builds a workflow definition in Go: the same document as
// a JSON definition (docs/protocol.md §8), checked by Definition.
//
//	wf := jetfleet.NewWorkflow("nightly-export")
//	list := jetfleet.StepFor[ListFiles](wf, "list")
//	export := jetfleet.StepFor[ExportFile](wf, "export").After(list).
//		ForEach("{{steps.list.result.files}}").Parallelism(10).Attempts(3).Backoff(30 * time.Second).
//		Input(map[string]any{"file": "{{item}}"})
//	jetfleet.StepFor[Report](wf, "report").After(export).When(protocol.WhenAlways).
//		Input(map[string]any{"failed": "{{steps.export.failed}}"})
//	def, err := wf.Definition()
type WorkflowBuilder struct {
	def   protocol.WorkflowDefinition
	steps []*StepBuilder
	errs  []error
}

// StepBuilder sets one step of a WorkflowBuilder; each method returns it.
type StepBuilder struct {
	w *WorkflowBuilder
	s protocol.WorkflowStep
}

// NewWorkflow starts the definition of workflow name.
func NewWorkflow(name string) *WorkflowBuilder {
	return &WorkflowBuilder{def: protocol.WorkflowDefinition{Name: name}}
}

// Describe sets the workflow's description.
func (w *WorkflowBuilder) Describe(description string) *WorkflowBuilder {
	w.def.Description = description
	return w
}

// Step adds a step running jobs of kind (on queue default unless Queue).
func (w *WorkflowBuilder) Step(name, kind string) *StepBuilder {
	sb := &StepBuilder{w: w, s: protocol.WorkflowStep{Name: name, Kind: kind}}
	w.steps = append(w.steps, sb)
	return sb
}

// StepFor adds a step whose jobs are of T's kind and, when T names one
// (QueueArgs), on T's queue: the args type ties the step to its handler
// (agent.AddHandler[T]).
func StepFor[T Args](w *WorkflowBuilder, name string) *StepBuilder {
	var args T
	sb := w.Step(name, args.Kind())
	if q, ok := any(args).(QueueArgs); ok {
		sb.s.Queue = q.Queue()
	}
	return sb
}

// Queue sets the step's queue.
func (sb *StepBuilder) Queue(queue string) *StepBuilder { sb.s.Queue = queue; return sb }

// After makes the step depend on steps (it starts once they have ended).
func (sb *StepBuilder) After(steps ...*StepBuilder) *StepBuilder {
	for _, d := range steps {
		sb.s.DependsOn = append(sb.s.DependsOn, d.s.Name)
	}
	return sb
}

// When sets the condition on the steps it depends on:
// protocol.WhenSuccess (the default), WhenOnFailure or WhenAlways.
func (sb *StepBuilder) When(when string) *StepBuilder { sb.s.When = when; return sb }

// Input sets the jobs' payload: a value encoded as JSON whose strings may
// hold templates ({{input.…}}, {{item}}, {{steps.<step>.result.…}}…).
func (sb *StepBuilder) Input(v any) *StepBuilder {
	data, err := json.Marshal(v)
	if err != nil {
		sb.w.errs = append(sb.w.errs, fmt.Errorf("step %s: input: %w", sb.s.Name, err))
		return sb
	}
	sb.s.Input = data
	return sb
}

// ForEach makes the step a fan-out over list: one template that yields a
// list (a string such as "{{steps.list.result.files}}"), or a literal list
// (any other value, encoded as JSON).
func (sb *StepBuilder) ForEach(list any) *StepBuilder {
	data, err := json.Marshal(list)
	if err != nil {
		sb.w.errs = append(sb.w.errs, fmt.Errorf("step %s: for_each: %w", sb.s.Name, err))
		return sb
	}
	sb.s.ForEach = data
	return sb
}

// Parallelism caps a fan-out's jobs queued or running at once (0: all).
func (sb *StepBuilder) Parallelism(n int) *StepBuilder { sb.s.Parallelism = n; return sb }

// FailFast makes the first failed element of a fan-out cancel the others
// and fail the step (the default goes on and lists the failures).
func (sb *StepBuilder) FailFast() *StepBuilder {
	sb.s.OnElementFailure = protocol.ElementFailureFailFast
	return sb
}

// Timeout bounds one attempt of the step's jobs.
func (sb *StepBuilder) Timeout(d time.Duration) *StepBuilder { sb.s.Timeout = d.String(); return sb }

// Attempts sets the step's jobs' attempts before they are dead-lettered.
func (sb *StepBuilder) Attempts(n int) *StepBuilder { sb.s.Attempts = n; return sb }

// Backoff sets the delays before the retries; the last one repeats.
func (sb *StepBuilder) Backoff(delays ...time.Duration) *StepBuilder {
	sb.s.Backoff = nil
	for _, d := range delays {
		sb.s.Backoff = append(sb.s.Backoff, d.String())
	}
	return sb
}

// Definition returns the checked definition, or every error found: those
// of the builder's values, then the definition's own (naming the step and
// the field: a cycle, an unknown dependency, a template reading a step not
// upstream…).
func (w *WorkflowBuilder) Definition() (*protocol.WorkflowDefinition, error) {
	if len(w.errs) > 0 {
		return nil, errors.Join(w.errs...)
	}
	def := w.def
	def.Steps = make([]protocol.WorkflowStep, len(w.steps))
	for i, sb := range w.steps {
		def.Steps[i] = sb.s
	}
	data, err := json.Marshal(def)
	if err != nil {
		return nil, err
	}
	return protocol.ParseWorkflowDefinition(data)
}
