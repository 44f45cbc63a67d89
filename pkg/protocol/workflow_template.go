package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
)

// Workflow templates build a step's input from the run and earlier results.
// A template is {{ path }} inside a JSON string of the step's input (or its
// for_each). A string that is exactly one template takes the value it names,
// whatever its JSON type; a template among other text is written into the
// string (a string as is, anything else as JSON). Paths:
//
//	input.<field>…                   the run's input
//	run.id, run.workflow             the run
//	item.<field>…, index             the element, in a fan-out step
//	steps.<step>.result.<field>…     the result of a step upstream
//	steps.<step>.error               its error, when it failed
//	steps.<step>.succeeded           a fan-out's elements that succeeded: [{index, item, result}]
//	steps.<step>.failed              a fan-out's elements that failed: [{index, item, error}]
//
// A field of a list is an element number (steps.list.result.files.0).

// WorkflowScope is what templates of one job read.
type WorkflowScope struct {
	RunID    string
	Workflow string
	Input    any
	// InFanOut is set for a fan-out element's job, with its Item and Index.
	InFanOut bool
	Item     any
	Index    int
	// Steps holds the outcomes of the steps upstream, by name.
	Steps map[string]WorkflowStepOutcome
}

// WorkflowStepOutcome is what a step left for the steps after it.
// Every field is in a template's scope even when empty: a step that
// returned no result reads as null, a fan-out without failures as [].
type WorkflowStepOutcome struct {
	Result    any                      `json:"result"`
	Error     string                   `json:"error"`
	Succeeded []WorkflowElementResult  `json:"succeeded"`
	Failed    []WorkflowElementFailure `json:"failed"`
}

// WorkflowElementResult is a fan-out element that succeeded.
type WorkflowElementResult struct {
	Index  int `json:"index"`
	Item   any `json:"item"`
	Result any `json:"result"`
}

// WorkflowElementFailure is a fan-out element that failed, with its error.
type WorkflowElementFailure struct {
	Index int    `json:"index"`
	Item  any    `json:"item"`
	Error string `json:"error"`
}

// templateRef is one {{ path }}: its text and its path's segments.
type templateRef struct {
	text     string
	segments []string
}

// wholeTemplate reports whether s is exactly one template, and its path.
func wholeTemplate(s string) (templateRef, bool) {
	refs, rest, err := parseTemplates(s)
	if err != nil || len(refs) != 1 || strings.TrimSpace(rest) != "" {
		return templateRef{}, false
	}
	return refs[0], true
}

// parseTemplates finds the templates of s; rest is s without them.
func parseTemplates(s string) (refs []templateRef, rest string, err error) {
	var plain strings.Builder
	for {
		open := strings.Index(s, "{{")
		if open < 0 {
			plain.WriteString(s)
			return refs, plain.String(), nil
		}
		end := strings.Index(s[open:], "}}")
		if end < 0 {
			return nil, "", fmt.Errorf("%q opens a template with {{ and does not close it", s)
		}
		text := s[open : open+end+2]
		path := strings.TrimSpace(s[open+2 : open+end])
		if path == "" {
			return nil, "", fmt.Errorf("%s is an empty template", text)
		}
		segments := strings.Split(path, ".")
		for _, seg := range segments {
			if seg == "" || !allTokenBytes(seg, false) {
				return nil, "", fmt.Errorf("%s: %q is not a field name or an element number", text, seg)
			}
		}
		refs = append(refs, templateRef{text: text, segments: segments})
		plain.WriteString(s[:open])
		s = s[open+end+2:]
	}
}

// validateTemplates checks every template in raw against the definition:
// the names it reads must exist where the step runs.
func validateTemplates(raw json.RawMessage, step WorkflowStep, upstream map[string]bool, def *WorkflowDefinition) error {
	if len(raw) == 0 {
		return nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return errors.New("not a JSON value")
	}
	var errs []error
	walkStrings(v, func(s string) {
		refs, _, err := parseTemplates(s)
		if err != nil {
			errs = append(errs, err)
			return
		}
		for _, ref := range refs {
			if err := checkRef(ref, step, upstream, def); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", ref.text, err))
			}
		}
	})
	return errors.Join(errs...)
}

func checkRef(ref templateRef, step WorkflowStep, upstream map[string]bool, def *WorkflowDefinition) error {
	seg := ref.segments
	switch seg[0] {
	case "input":
		return nil
	case "run":
		if len(seg) != 2 || (seg[1] != "id" && seg[1] != "workflow") {
			return errors.New("the run has id and workflow")
		}
		return nil
	case "item", "index":
		if !step.IsFanOut() {
			return fmt.Errorf("%s exists only in a fan-out step (for_each)", seg[0])
		}
		if seg[0] == "index" && len(seg) > 1 {
			return errors.New("index is a number and has no fields")
		}
		return nil
	case "steps":
		if len(seg) < 3 {
			return errors.New("name a step and what of it: steps.<step>.result, .error, .succeeded or .failed")
		}
		name := seg[1]
		target, ok := def.Step(name)
		switch {
		case !ok:
			return fmt.Errorf("there is no step called %q", name)
		case !upstream[name]:
			return fmt.Errorf("step %q is not upstream of this step: its result is missing when this step runs (add it to depends_on)", name)
		}
		switch seg[2] {
		case "result":
			if target.IsFanOut() {
				return fmt.Errorf("step %q is a fan-out: read its .succeeded and .failed elements", name)
			}
		case "error":
			if len(seg) > 3 {
				return errors.New("an error is a string and has no fields")
			}
		case "succeeded", "failed":
			if !target.IsFanOut() {
				return fmt.Errorf("step %q is not a fan-out: read its .result", name)
			}
		default:
			return fmt.Errorf("%q is not result, error, succeeded or failed", seg[2])
		}
		return nil
	default:
		return fmt.Errorf("%q is not input, run, item, index or steps", seg[0])
	}
}

// walkStrings calls fn with every string of a decoded JSON value.
func walkStrings(v any, fn func(string)) {
	switch v := v.(type) {
	case string:
		fn(v)
	case []any:
		for _, x := range v {
			walkStrings(x, fn)
		}
	case map[string]any:
		for _, x := range v {
			walkStrings(x, fn)
		}
	}
}

// RenderWorkflowInput builds a job's payload from the step's input
// template; without one, the payload is the run's input.
func RenderWorkflowInput(raw json.RawMessage, scope WorkflowScope) (json.RawMessage, error) {
	inputs, err := NewWorkflowInputs(raw, scope)
	if err != nil {
		return nil, err
	}
	item, err := roundTrip(scope.Item) // the shape a template sees
	if err != nil {
		return nil, err
	}
	return inputs.Render(item, scope.Index)
}

// WorkflowInputs renders one step's input for many jobs — the elements of a
// fan-out — decoding the template and the scope once: the scope holds the
// outcomes of the steps upstream, which can be a list of thousands, and
// rebuilding it per element made a fan-out quadratic.
type WorkflowInputs struct {
	template any             // decoded; nil without a template
	runInput json.RawMessage // the payload without a template
	base     map[string]any  // the scope without item and index
	inFanOut bool
}

// NewWorkflowInputs prepares the rendering of template raw in scope (whose
// Item and Index are left out: Render gives them).
func NewWorkflowInputs(raw json.RawMessage, scope WorkflowScope) (*WorkflowInputs, error) {
	if len(raw) == 0 {
		input, err := json.Marshal(scope.Input)
		if err != nil {
			return nil, fmt.Errorf("run input: %w", err)
		}
		return &WorkflowInputs{runInput: input}, nil
	}
	template, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	inFanOut := scope.InFanOut
	scope.InFanOut, scope.Item, scope.Index = false, nil, 0
	base, err := scope.root()
	if err != nil {
		return nil, err
	}
	return &WorkflowInputs{template: template, base: base, inFanOut: inFanOut}, nil
}

// Render builds the payload of the job of element index, whose item is as
// DecodeJSON returns it (ignored outside a fan-out: see WorkflowScope).
func (w *WorkflowInputs) Render(item any, index int) (json.RawMessage, error) {
	if w.template == nil {
		return w.runInput, nil
	}
	root := w.base
	if w.inFanOut {
		root = make(map[string]any, len(w.base)+2)
		maps.Copy(root, w.base)
		root["item"], root["index"] = item, json.Number(strconv.Itoa(index))
	}
	out, err := render(w.template, root)
	if err != nil {
		return nil, err
	}
	return json.Marshal(out)
}

// roundTrip returns v as DecodeJSON would read it once marshalled.
func roundTrip(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("workflow scope: %w", err)
	}
	return decodeJSON(b)
}

// RenderForEach yields the elements of a fan-out step.
func RenderForEach(raw json.RawMessage, scope WorkflowScope) ([]any, error) {
	v, err := decodeJSON(raw)
	if err != nil {
		return nil, err
	}
	if s, ok := v.(string); ok {
		ref, ok := wholeTemplate(s)
		if !ok {
			return nil, fmt.Errorf("for_each %q is not one template", s)
		}
		root, err := scope.root()
		if err != nil {
			return nil, err
		}
		if v, err = lookup(root, ref); err != nil {
			return nil, err
		}
		list, ok := v.([]any)
		if !ok {
			return nil, fmt.Errorf("for_each %s is %s, not a list", ref.text, jsonType(v))
		}
		return list, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("for_each is %s, not a list", jsonType(v))
	}
	root, err := scope.root()
	if err != nil {
		return nil, err
	}
	rendered, err := render(list, root) // a literal list's elements may hold templates
	if err != nil {
		return nil, err
	}
	return rendered.([]any), nil
}

// DecodeJSON decodes a JSON value as templates see it: numbers stay
// json.Number, so that an integer passes through a render exactly.
func DecodeJSON(raw []byte) (any, error) { return decodeJSON(raw) }

// root is the scope as one decoded JSON tree, the shape paths walk.
func (s WorkflowScope) root() (map[string]any, error) {
	doc := map[string]any{
		"input": s.Input,
		"run":   map[string]any{"id": s.RunID, "workflow": s.Workflow},
		"steps": s.Steps,
	}
	if s.InFanOut {
		doc["item"], doc["index"] = s.Item, s.Index
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("workflow scope: %w", err)
	}
	v, err := decodeJSON(b)
	if err != nil {
		return nil, err
	}
	return v.(map[string]any), nil
}

func render(v any, root map[string]any) (any, error) {
	switch v := v.(type) {
	case string:
		return renderString(v, root)
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			r, err := render(x, root)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			r, err := render(x, root)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	default:
		return v, nil
	}
}

func renderString(s string, root map[string]any) (any, error) {
	if ref, ok := wholeTemplate(s); ok {
		return lookup(root, ref)
	}
	var out strings.Builder
	for {
		open := strings.Index(s, "{{")
		if open < 0 {
			out.WriteString(s)
			return out.String(), nil
		}
		end := strings.Index(s[open:], "}}")
		if end < 0 {
			return nil, fmt.Errorf("%q opens a template with {{ and does not close it", s)
		}
		refs, _, err := parseTemplates(s[open : open+end+2])
		if err != nil {
			return nil, err
		}
		v, err := lookup(root, refs[0])
		if err != nil {
			return nil, err
		}
		out.WriteString(s[:open])
		if str, ok := v.(string); ok {
			out.WriteString(str)
		} else {
			b, _ := json.Marshal(v) // decoded JSON marshals
			out.Write(b)
		}
		s = s[open+end+2:]
	}
}

// lookup walks ref's path through the scope; a missing field is an error
// naming the part of the path that exists.
func lookup(root map[string]any, ref templateRef) (any, error) {
	var cur any = root
	for i, seg := range ref.segments {
		at := strings.Join(ref.segments[:i], ".")
		switch c := cur.(type) {
		case map[string]any:
			next, ok := c[seg]
			if !ok {
				if i == 0 {
					return nil, fmt.Errorf("%s: %q is not in scope", ref.text, seg)
				}
				return nil, fmt.Errorf("%s: %s has no field %q", ref.text, at, seg)
			}
			cur = next
		case []any:
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 || n >= len(c) {
				return nil, fmt.Errorf("%s: %s is a list of %d, without element %q", ref.text, at, len(c), seg)
			}
			cur = c[n]
		default:
			return nil, fmt.Errorf("%s: %s is %s, without field %q", ref.text, at, jsonType(c), seg)
		}
	}
	return cur, nil
}

func decodeJSON(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // keep integers exact through a render
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not a JSON value: %w", err)
	}
	return v, nil
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number, float64:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	default:
		return fmt.Sprintf("%T", v)
	}
}
