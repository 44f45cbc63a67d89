package protocol

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nightlyExport is the design brief's scenario: list the files, export each
// (3 attempts, 30 s apart), report the failures, alert when something failed.
const nightlyExport = `{
  "name": "nightly-export",
  "steps": [
    {"name": "list", "kind": "list-files", "input": {"bucket": "{{input.bucket}}"}},
    {"name": "export", "kind": "export-file", "queue": "exports", "depends_on": ["list"],
     "for_each": "{{steps.list.result.files}}", "parallelism": 10, "attempts": 3, "backoff": ["30s"],
     "timeout": "5m", "input": {"file": "{{item}}", "run": "{{run.id}}", "label": "file {{index}} of {{input.bucket}}"}},
    {"name": "report", "kind": "report", "depends_on": ["export"],
     "input": {"failed": "{{steps.export.failed}}", "ok": "{{steps.export.succeeded}}"}},
    {"name": "page", "kind": "alert", "depends_on": ["export"], "when": "on_failure"}
  ]
}`

func TestParseWorkflowDefinitionAcceptsTheNightlyExport(t *testing.T) {
	def, err := ParseWorkflowDefinition([]byte(nightlyExport))
	require.NoError(t, err)
	assert.Equal(t, []string{"list"}, def.Roots())
	export, ok := def.Step("export")
	require.True(t, ok)
	assert.True(t, export.IsFanOut())
	assert.Equal(t, "exports", export.QueueOrDefault())
	report, _ := def.Step("report")
	assert.Equal(t, "default", report.QueueOrDefault())
	assert.Equal(t, map[string]bool{"export": true, "list": true}, def.Upstream("report"))
}

func TestWorkflowDefinitionErrorsNameTheStepAndTheField(t *testing.T) {
	for name, tc := range map[string]struct {
		def  string
		want []string
	}{
		"cycle": {`{"name":"w","steps":[
			{"name":"a","kind":"k","depends_on":["c"]},
			{"name":"b","kind":"k","depends_on":["a"]},
			{"name":"c","kind":"k","depends_on":["b"]}]}`,
			[]string{"depends_on: the steps form a cycle:", "a → b → c → a"}},
		"unknown dependency": {`{"name":"w","steps":[{"name":"a","kind":"k","depends_on":["nope"]}]}`,
			[]string{"step a: depends_on: no step called \"nope\""}},
		"self dependency": {`{"name":"w","steps":[{"name":"a","kind":"k","depends_on":["a"]}]}`,
			[]string{"step a: depends_on: the step depends on itself"}},
		"fan-out over a number": {`{"name":"w","steps":[{"name":"a","kind":"k","for_each":5}]}`,
			[]string{"step a: for_each: 5 is not a list"}},
		"fan-out over an object": {`{"name":"w","steps":[{"name":"a","kind":"k","for_each":{"x":1}}]}`,
			[]string{"step a: for_each:", "is not a list"}},
		"fan-out over text": {`{"name":"w","steps":[{"name":"a","kind":"k","for_each":"files: {{input.files}}"}]}`,
			[]string{"step a: for_each:", "neither a list nor one template"}},
		"template naming a missing result": {`{"name":"w","steps":[
			{"name":"a","kind":"k"},{"name":"b","kind":"k","input":{"x":"{{steps.a.result.x}}"}}]}`,
			[]string{"step b: input: {{steps.a.result.x}}:", "not upstream", "depends_on"}},
		"template naming no step": {`{"name":"w","steps":[{"name":"a","kind":"k","input":"{{steps.zz.result}}"}]}`,
			[]string{"step a: input: {{steps.zz.result}}: there is no step called \"zz\""}},
		"item outside a fan-out": {`{"name":"w","steps":[{"name":"a","kind":"k","input":{"f":"{{item}}"}}]}`,
			[]string{"step a: input: {{item}}: item exists only in a fan-out step"}},
		"result of a fan-out": {`{"name":"w","steps":[{"name":"a","kind":"k","for_each":[1,2]},
			{"name":"b","kind":"k","depends_on":["a"],"input":"{{steps.a.result}}"}]}`,
			[]string{"step b: input: {{steps.a.result}}:", "is a fan-out"}},
		"item in for_each": {`{"name":"w","steps":[{"name":"a","kind":"k","for_each":"{{item.files}}"}]}`,
			[]string{"step a: for_each: {{item.files}}: item exists only in a fan-out step"}},
		"unknown root": {`{"name":"w","steps":[{"name":"a","kind":"k","input":"{{env.HOME}}"}]}`,
			[]string{`{{env.HOME}}: "env" is not input, run, item, index or steps`}},
		"unclosed template": {`{"name":"w","steps":[{"name":"a","kind":"k","input":"{{input.x"}]}`,
			[]string{"step a: input:", "does not close it"}},
		"unknown field": {`{"name":"w","steps":[{"name":"a","kind":"k","retries":3}]}`,
			[]string{`unknown field "retries"`}},
		"fields of a step": {`{"name":"w","steps":[{"name":"a b","kind":"","queue":"q.1","when":"later",
			"timeout":"soon","attempts":-1,"backoff":["x"],"parallelism":2}]}`,
			[]string{"step a b: name:", "kind:", "queue:", `when: "later"`, `timeout: "soon"`, "attempts: -1",
				`backoff[0]: "x"`, "parallelism: only a fan-out step"}},
		"two steps with one name": {`{"name":"w","steps":[{"name":"a","kind":"k"},{"name":"a","kind":"k"}]}`,
			[]string{`steps[1]: a second step called "a"`}},
		"no steps":                {`{"name":"w","steps":[]}`, []string{"steps: a workflow needs at least one step"}},
		"on_failure without deps": {`{"name":"w","steps":[{"name":"a","kind":"k","when":"on_failure"}]}`, []string{"step a: when: an on_failure step needs depends_on"}},
		"bad workflow name":       {`{"name":"night ly","steps":[{"name":"a","kind":"k"}]}`, []string{"name: invalid workflow name"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseWorkflowDefinition([]byte(tc.def))
			require.Error(t, err)
			for _, want := range tc.want {
				assert.ErrorContains(t, err, want)
			}
		})
	}
}

func TestRenderWorkflowInputKeepsTypesAndInterpolates(t *testing.T) {
	def, err := ParseWorkflowDefinition([]byte(nightlyExport))
	require.NoError(t, err)
	export, _ := def.Step("export")
	scope := WorkflowScope{
		RunID: "r1", Workflow: "nightly-export",
		Input: map[string]any{"bucket": "s3://exports"},
		Steps: map[string]WorkflowStepOutcome{"list": {Result: map[string]any{
			"files": []any{"a.csv", map[string]any{"path": "b.csv", "size": 12345678901234}}}}},
	}
	items, err := RenderForEach(export.ForEach, scope)
	require.NoError(t, err)
	require.Len(t, items, 2)

	scope.InFanOut, scope.Item, scope.Index = true, items[1], 1
	payload, err := RenderWorkflowInput(export.Input, scope)
	require.NoError(t, err)
	assert.JSONEq(t, `{"file":{"path":"b.csv","size":12345678901234},"run":"r1","label":"file 1 of s3://exports"}`,
		string(payload), "a whole template keeps the value's type; integers stay exact")

	report, _ := def.Step("report")
	scope = WorkflowScope{RunID: "r1", Steps: map[string]WorkflowStepOutcome{"export": {
		Succeeded: []WorkflowElementResult{{Index: 0, Item: "a.csv", Result: map[string]any{"rows": 3}}},
		Failed:    []WorkflowElementFailure{{Index: 1, Item: "b.csv", Error: "disk full"}},
	}}}
	payload, err = RenderWorkflowInput(report.Input, scope)
	require.NoError(t, err)
	assert.JSONEq(t, `{"failed":[{"index":1,"item":"b.csv","error":"disk full"}],
		"ok":[{"index":0,"item":"a.csv","result":{"rows":3}}]}`, string(payload))

	page, _ := def.Step("page")
	payload, err = RenderWorkflowInput(page.Input, WorkflowScope{Input: map[string]any{"bucket": "x"}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"bucket":"x"}`, string(payload), "without an input template, the run's input")
}

func TestRenderWorkflowInputOfADiamondReadsBothBranches(t *testing.T) {
	def, err := ParseWorkflowDefinition([]byte(`{"name":"diamond","steps":[
		{"name":"a","kind":"k"},
		{"name":"b","kind":"k","depends_on":["a"],"input":{"n":"{{steps.a.result.n}}"}},
		{"name":"c","kind":"k","depends_on":["a"]},
		{"name":"d","kind":"k","depends_on":["b","c"],"input":{"b":"{{steps.b.result}}","c":"{{steps.c.result.v}}","a":"{{steps.a.result.n}}"}}]}`))
	require.NoError(t, err)
	d, _ := def.Step("d")
	payload, err := RenderWorkflowInput(d.Input, WorkflowScope{Steps: map[string]WorkflowStepOutcome{
		"a": {Result: map[string]any{"n": 1}}, "b": {Result: "from b"}, "c": {Result: map[string]any{"v": []any{true}}},
	}})
	require.NoError(t, err)
	assert.JSONEq(t, `{"a":1,"b":"from b","c":[true]}`, string(payload))
}

func TestRenderingFailsWithAReasonWhenTheValueIsMissingOrNotAList(t *testing.T) {
	forEach := json.RawMessage(`"{{input.files}}"`)
	_, err := RenderForEach(forEach, WorkflowScope{Input: map[string]any{"files": "a.csv"}})
	assert.EqualError(t, err, "for_each {{input.files}} is a string, not a list")
	_, err = RenderForEach(forEach, WorkflowScope{Input: map[string]any{}})
	assert.EqualError(t, err, `{{input.files}}: input has no field "files"`)
	_, err = RenderForEach(json.RawMessage(`"{{steps.list.result.files.3}}"`), WorkflowScope{
		Steps: map[string]WorkflowStepOutcome{"list": {Result: map[string]any{"files": []any{"x"}}}}})
	assert.EqualError(t, err, `{{steps.list.result.files.3}}: steps.list.result.files is a list of 1, without element "3"`)
	_, err = RenderWorkflowInput(json.RawMessage(`{"x":"{{input.a.b}}"}`), WorkflowScope{Input: map[string]any{"a": 5}})
	assert.EqualError(t, err, `{{input.a.b}}: input.a is a number, without field "b"`)
}

func TestWorkflowStepJobIDIsDeterministicAndAValidJobID(t *testing.T) {
	assert.Equal(t, "wf:r1:list", WorkflowStepJobID("r1", "list", -1, 0))
	assert.Equal(t, "wf:r1:export:7", WorkflowStepJobID("r1", "export", 7, 0))
	assert.Equal(t, "wf:r1:export:7~2", WorkflowStepJobID("r1", "export", 7, 2))
	assert.Equal(t, WorkflowStepJobID("r1", "export", 7, 0), WorkflowStepJobID("r1", "export", 7, 0))
	require.NoError(t, ValidateJobID(WorkflowStepJobID("r1", "export", 7, 1)))
}
