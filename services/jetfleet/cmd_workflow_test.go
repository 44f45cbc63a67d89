package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

func TestWorkflowCounts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		steps, elements int
		want            string
	}{
		{0, 0, "-"},
		{1, 0, "1 step"},
		{2, 3, "2 steps, 3 elements"},
		{0, 1, "1 element"},
	} {
		assert.Equal(t, tc.want, failedCounts(tc.steps, tc.elements))
	}
	for _, tc := range []struct {
		counts map[string]int
		want   string
	}{
		{nil, "-"},
		{map[string]int{"failed": 3, "succeeded": 97}, "97 succeeded, 3 failed"},
		{map[string]int{"waiting": 5, "running": 2, "succeeded": 0, "cancelled": 1}, "1 cancelled, 2 running, 5 waiting"},
		{map[string]int{"zeta": 1, "alpha": 2, "succeeded": 1}, "1 succeeded, 2 alpha, 1 zeta"},
	} {
		assert.Equal(t, tc.want, elementCounts(tc.counts), "%v", tc.counts)
	}
	for _, tc := range []struct {
		raw, want string
	}{
		{``, "-"},
		{`{ "file": "a.csv",  "n": [1, 2] }`, `{"file":"a.csv","n":[1,2]}`},
		{`"` + strings.Repeat("x", 80) + `"`, `"` + strings.Repeat("x", 58) + "…"},
		{"not json\n at all", "not json at all"},
	} {
		assert.Equal(t, tc.want, compactJSON(json.RawMessage(tc.raw), 60), "%s", tc.raw)
	}
}

func TestWorkflowRunsTable(t *testing.T) {
	t.Parallel()
	started := time.Date(2026, 11, 26, 7, 0, 0, 0, time.FixedZone("CET", 3600))
	ended := started.Add(90 * time.Second)
	for _, tc := range []struct {
		name string
		runs []jetfleet.WorkflowRunSummary
		want string
	}{
		{name: "none", want: "no workflow runs\n"},
		{name: "running and failed", runs: []jetfleet.WorkflowRunSummary{
			{RunID: "r2", Workflow: "nightly-export", Status: "running", StartedAt: started},
			{RunID: "run-1", Workflow: "nightly-export", Status: "failed", Round: 1, StartedAt: started, EndedAt: &ended,
				FailedSteps: 2, FailedElements: 3},
		}, want: "" +
			"RUN    WORKFLOW        STATUS   ROUND  STARTED               ENDED                 FAILED\n" +
			"r2     nightly-export  running  0      2026-11-26T06:00:00Z  -                     -\n" +
			"run-1  nightly-export  failed   1      2026-11-26T06:00:00Z  2026-11-26T06:01:30Z  2 steps, 3 elements\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			require.NoError(t, printWorkflowRuns(&out, tc.runs))
			assert.Equal(t, tc.want, out.String())
		})
	}
}

func TestWorkflowRunTable(t *testing.T) {
	t.Parallel()
	started := time.Date(2026, 11, 26, 6, 0, 0, 0, time.UTC)
	ended := started.Add(time.Minute)
	listEnded := started.Add(1500 * time.Millisecond)
	summary := jetfleet.WorkflowRunSummary{RunID: "run-1", Workflow: "nightly-export", Status: "failed", Round: 1,
		StartedAt: started, EndedAt: &ended, FailedElements: 2}
	for _, tc := range []struct {
		name string
		run  jetfleet.WorkflowRunDetail
		want string
	}{
		{name: "failed elements", run: jetfleet.WorkflowRunDetail{WorkflowRunSummary: summary,
			Steps: []jetfleet.WorkflowStepView{
				{Name: "list", Kind: "list-files", Queue: "default", Status: "succeeded", JobID: "wf:run-1:list",
					StartedAt: &started, EndedAt: &listEnded},
				{Name: "export", Kind: "export-file", Queue: "exports", Status: "succeeded", JobID: "wf:run-1:export",
					Elements: map[string]int{"succeeded": 97, "failed": 2}},
				{Name: "page", Kind: "alert", Queue: "default", Status: "skipped"},
				{Name: "report", Kind: "report", Queue: "default", Status: "failed", Error: "template {{steps.x}}: no such step\nmore"},
			},
			Failures: jetfleet.WorkflowFailures{Elements: []jetfleet.WorkflowElementFailure{
				{Step: "export", Index: 3, Item: json.RawMessage(`{"file": "s3://bucket/a-very-long-path/that/goes/on/and/on/report.csv"}`),
					JobID: "wf:run-1:export:3~1", Error: "malformed payload: no such file\nstack"},
				{Step: "export", Index: 41, Item: json.RawMessage(`"b.csv"`), JobID: "wf:run-1:export:41~1", Error: "timeout"},
			}}},
			want: "" +
				"RUN       run-1\n" +
				"WORKFLOW  nightly-export\n" +
				"STATUS    failed (2 elements failed)\n" +
				"ROUND     1\n" +
				"STARTED   2026-11-26T06:00:00Z\n" +
				"ENDED     2026-11-26T06:01:00Z\n" +
				"\n" +
				"STEP    KIND         QUEUE    STATUS     TOOK  ELEMENTS                ERROR\n" +
				"list    list-files   default  succeeded  1.5s  -                       -\n" +
				"export  export-file  exports  succeeded  -     97 succeeded, 2 failed  -\n" +
				"page    alert        default  skipped    -     -                       -\n" +
				"report  report       default  failed     -     -                       template {{steps.x}}: no such step\n" +
				"\n" +
				"FAILED ELEMENTS\n" +
				"STEP    INDEX  ITEM                                                          JOB                   ERROR\n" +
				"export  3      {\"file\":\"s3://bucket/a-very-long-path/that/goes/on/and/on/r…  wf:run-1:export:3~1   malformed payload: no such file\n" +
				"export  41     \"b.csv\"                                                       wf:run-1:export:41~1  timeout\n"},
		{name: "running, no steps yet", run: jetfleet.WorkflowRunDetail{WorkflowRunSummary: jetfleet.WorkflowRunSummary{
			RunID: "r", Workflow: "w", Status: "running", StartedAt: started}},
			want: "" +
				"RUN       r\n" +
				"WORKFLOW  w\n" +
				"STATUS    running\n" +
				"ROUND     0\n" +
				"STARTED   2026-11-26T06:00:00Z\n" +
				"ENDED     -\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			require.NoError(t, printWorkflowRun(&out, &tc.run))
			assert.Equal(t, tc.want, out.String())
		})
	}
}

func TestWorkflowUsageErrors(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.yaml")
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("name: x\n  steps: []\n"), 0o600))
	for _, tc := range []struct {
		args   []string
		want   string
		status int
	}{
		{[]string{"workflow"}, "workflow needs a subcommand: add, ls, show, rm, run, runs, get, retry-failed or cancel", 2},
		{[]string{"workflow", "nosuch"}, `unknown workflow command "nosuch": want add, ls, show, rm, run, runs, get, retry-failed or cancel`, 2},
		{[]string{"workflow", "add"}, "workflow add needs -f <file> (JSON or YAML; '-' for standard input)", 2},
		{[]string{"workflow", "add", "flow.yaml"}, `workflow add takes no arguments, got ["flow.yaml"]: the definition, its name included, is read from -f <file>`, 2},
		{[]string{"workflow", "add", "-f", missing}, "workflow add: -f: open " + missing + ": no such file or directory", 1},
		{[]string{"workflow", "add", "-f", bad}, "workflow add: -f: " + bad + ": invalid YAML: line 2: mapping values are not allowed", 1},
		{[]string{"workflow", "ls", "x"}, `workflow ls takes no arguments, got ["x"]`, 2},
		{[]string{"workflow", "show"}, "workflow show needs the workflow <name>", 2},
		{[]string{"workflow", "rm"}, "workflow rm needs the workflow <name>", 2},
		{[]string{"workflow", "run"}, "workflow run needs the workflow <name>", 2},
		{[]string{"workflow", "run", "w", "-input", "{"}, "workflow run: -input is not JSON: {", 2},
		{[]string{"workflow", "run", "w", "-input", "{}", "-input-file", "x.json"}, "workflow run: give -input or -input-file, not both", 2},
		{[]string{"workflow", "run", "w", "-input-file", missing}, "workflow run: -input-file: open " + missing, 1},
		{[]string{"workflow", "run", "w", "-wait", "-wait-timeout", "0s"}, "workflow run: -wait-timeout 0s is not positive", 2},
		{[]string{"workflow", "run", "w", "-wait-timeout", "soon"}, `workflow run: invalid value "soon" for flag -wait-timeout`, 2},
		{[]string{"workflow", "runs", "-status", "done"}, `workflow runs: -status "done": want running, succeeded, failed or cancelled`, 2},
		{[]string{"workflow", "runs", "-limit", "1001"}, "workflow runs: -limit 1001: want 1 to 1000", 2},
		{[]string{"workflow", "get"}, "workflow get needs the <run_id>", 2},
		{[]string{"workflow", "get", "a", "b"}, `workflow get takes the <run_id>, got 1 more: ["b"]`, 2},
		{[]string{"workflow", "retry-failed"}, "workflow retry-failed needs the <run_id>", 2},
		{[]string{"workflow", "cancel"}, "workflow cancel needs the <run_id>", 2},
		{[]string{"workflow", "cancel", "-o", "yaml", "r"}, `workflow cancel: -o "yaml": want table or json`, 2},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			// No server listens there: every one of these fails before connecting.
			args := append(append([]string(nil), tc.args...), "-server", "nats://127.0.0.1:1")
			if len(tc.args) < 2 {
				args = tc.args
			}
			err := run(context.Background(), args, &bytes.Buffer{})
			require.ErrorContains(t, err, tc.want)
			assert.Equal(t, tc.status, exitCode(err), "%v", err)
		})
	}
}

// TestWorkflowCommands drives every workflow subcommand against a whole
// fleet in one process (devfleet: the supervisor runs the workflows, the
// agent the demo kinds echo, sleep and fail).
func TestWorkflowCommands(t *testing.T) {
	t.Parallel()
	cfg := devfleet.DefaultConfig()
	cfg.Embedded.Port, cfg.Embedded.DataDir, cfg.Telemetry.HTTPAddr = -1, t.TempDir(), ""
	cfg.Dashboard.Listen = devfleet.DashboardOff
	cfg.ApplyDefaults()
	fleet, err := devfleet.New(cfg, devfleet.Options{Logger: fleettest.Logger(t)})
	require.NoError(t, err)
	require.NoError(t, fleet.Start(fleettest.Ctx(t, 60*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = fleet.Stop(ctx)
	})
	ctx := fleettest.Ctx(t, 120*time.Second)
	cli := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, append(append([]string(nil), args...), "-server", fleet.ClientURL()), &out)
		return out.String(), err
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		return path
	}

	// add: YAML and JSON; an invalid definition is refused naming the step and the field.
	out, err := cli("workflow", "add", "-f", write("greet.yaml", `
name: cli-greet
description: greets, then echoes each item
steps:
  - name: hello
    kind: echo
    input: {who: "{{input.who}}"}
  - name: each
    kind: echo
    depends_on: [hello]
    for_each: "{{input.items}}"
    input: {item: "{{item}}", n: 12345678901234567890}
`))
	require.NoError(t, err)
	assert.Equal(t, "workflow cli-greet stored (revision 1, 2 steps)\n", out)
	out, err = cli("workflow", "add", "-f", write("naps.json", `{"name": "cli-naps", "steps": [
		{"name": "nap", "kind": "sleep", "for_each": "{{input.naps}}", "input": {"duration": "{{item}}"}},
		{"name": "report", "kind": "echo", "depends_on": ["nap"], "when": "always"}]}`), "-o", "json")
	require.NoError(t, err)
	var added jetfleet.WorkflowInfo
	require.NoError(t, json.Unmarshal([]byte(out), &added), out)
	assert.Equal(t, "cli-naps", added.Name)
	assert.Equal(t, 2, added.Steps)
	_, err = cli("workflow", "add", "-f", write("slow.yml", "name: cli-slow\nsteps:\n  - {name: nap, kind: sleep, input: {duration: 1m}}\n"))
	require.NoError(t, err)
	_, err = cli("workflow", "add", "-f", write("broken.yaml", "name: cli-broken\nsteps:\n  - {name: first, kind: echo}\n  - {name: second, kind: echo, when: sometimes}\n"))
	require.Error(t, err)
	assert.Equal(t, 1, exitCode(err), "%v", err)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeInvalidArgument))
	assert.ErrorContains(t, err, "step second: when:")

	// ls and show.
	out, err = cli("workflow", "ls")
	require.NoError(t, err)
	assert.Regexp(t, `NAME\s+STEPS\s+REVISION\s+UPDATED\s+DESCRIPTION`, out)
	assert.Regexp(t, `cli-greet\s+2\s+\d+\s+\S+\s+greets, then echoes each item\n`, out)
	assert.Contains(t, out, "cli-naps")
	assert.NotContains(t, out, "cli-broken")
	out, err = cli("workflow", "show", "cli-greet")
	require.NoError(t, err)
	var def protocol.WorkflowDefinition
	require.NoError(t, json.Unmarshal([]byte(out), &def), out)
	assert.Equal(t, "cli-greet", def.Name)
	require.Len(t, def.Steps, 2)
	assert.JSONEq(t, `{"item": "{{item}}", "n": 12345678901234567890}`, string(def.Steps[1].Input), "YAML numbers arrive exact")
	out, err = cli("workflow", "show", "-o", "json", "cli-greet")
	require.NoError(t, err)
	var info jetfleet.WorkflowInfo
	require.NoError(t, json.Unmarshal([]byte(out), &info), out)
	assert.NotZero(t, info.Revision)
	assert.Equal(t, 2, info.Steps)
	require.NotNil(t, info.Definition)
	_, err = cli("workflow", "show", "nosuch")
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
	assert.Equal(t, 1, exitCode(err))

	// run -wait of a run that succeeds; the same run id again is a duplicate.
	out, err = cli("workflow", "run", "cli-greet", "-id", "greet-1", "-input", `{"who": "cli", "items": ["a", "b", "c"]}`, "-wait")
	require.NoError(t, err, out)
	assert.Contains(t, out, "started run greet-1 of workflow cli-greet\n")
	assert.Regexp(t, `STATUS\s+succeeded\n`, out)
	assert.Regexp(t, `hello\s+echo\s+default\s+succeeded\s+[0-9.]+[mµ]?s\s+-\s+-\n`, out)
	assert.Regexp(t, `each\s+echo\s+default\s+succeeded\s+[0-9.]+[mµ]?s\s+3 succeeded\s+-\n`, out)
	assert.NotContains(t, out, "FAILED ELEMENTS")
	out, err = cli("workflow", "run", "cli-greet", "-id", "greet-1", "-input", `{"who": "cli", "items": []}`)
	require.NoError(t, err)
	assert.Contains(t, out, "duplicate: run greet-1 of workflow cli-greet was already started (status succeeded)")

	// run -wait of a run whose fan-out has a failed element: it prints the
	// element and exits with status 1. The input is read from YAML.
	out, err = cli("workflow", "run", "cli-naps", "-id", "naps-1", "-input-file", write("naps-input.yaml", "naps: [1ms, soon, 2ms]\n"),
		"-wait", "-wait-timeout", "1m")
	require.Error(t, err, out)
	assert.Equal(t, 1, exitCode(err))
	assert.ErrorContains(t, err, "run naps-1 of workflow cli-naps failed: 1 element failed")
	assert.Regexp(t, `STATUS\s+failed \(1 element failed\)`, out)
	assert.Regexp(t, `nap\s+sleep\s+default\s+\S+\s+[0-9.]+[mµ]?s\s+2 succeeded, 1 failed`, out)
	assert.Regexp(t, `report\s+echo\s+default\s+succeeded`, out, "an always step runs after a failed element")
	assert.Contains(t, out, "FAILED ELEMENTS")
	assert.Regexp(t, `nap\s+1\s+"soon"\s+wf:naps-1:nap:1\s+malformed_payload: malformed payload: duration "soon"`, out)

	// retry-failed runs the failed element again, in round 1; it fails again.
	out, err = cli("workflow", "retry-failed", "naps-1")
	require.NoError(t, err)
	assert.Contains(t, out, "run naps-1 of workflow cli-naps: retrying its failed work (round 1)")
	require.Eventually(t, func() bool {
		out, err = cli("workflow", "get", "naps-1")
		return err == nil && strings.Contains(out, "wf:naps-1:nap:1~1") && regexp.MustCompile(`STATUS\s+failed`).MatchString(out)
	}, 30*time.Second, 100*time.Millisecond, "the retried element fails again: %s", out)
	assert.Regexp(t, `ROUND\s+1\n`, out)
	out, err = cli("workflow", "get", "-o", "json", "naps-1")
	require.NoError(t, err)
	var detail jetfleet.WorkflowRunDetail
	require.NoError(t, json.Unmarshal([]byte(out), &detail), out)
	assert.Equal(t, jetfleet.WorkflowFailed, detail.Status)
	require.Len(t, detail.Failures.Elements, 1)
	assert.JSONEq(t, `"soon"`, string(detail.Failures.Elements[0].Item))

	// A wait bounded by -wait-timeout gives up on a run still sleeping; cancel ends the run.
	out, err = cli("workflow", "run", "cli-slow", "-id", "slow-1", "-wait", "-wait-timeout", "1s")
	require.Error(t, err)
	assert.Equal(t, 1, exitCode(err))
	assert.ErrorContains(t, err, "run slow-1 did not end within -wait-timeout 1s; see 'jetfleet workflow get slow-1'")
	assert.Equal(t, "started run slow-1 of workflow cli-slow\n", out)
	out, err = cli("workflow", "cancel", "slow-1")
	require.NoError(t, err)
	assert.Equal(t, "run slow-1 of workflow cli-slow: cancelled\n", out)
	out, err = cli("workflow", "run", "cli-slow", "-id", "slow-1", "-wait", "-o", "json")
	require.Error(t, err, "waiting for a cancelled run exits non-zero")
	assert.ErrorContains(t, err, "run slow-1 of workflow cli-slow was cancelled")
	require.NoError(t, json.Unmarshal([]byte(out), &detail), out)
	assert.Equal(t, jetfleet.WorkflowCancelled, detail.Status)

	// runs lists them newest first, and filters.
	out, err = cli("workflow", "runs")
	require.NoError(t, err)
	assert.Regexp(t, `RUN\s+WORKFLOW\s+STATUS\s+ROUND\s+STARTED\s+ENDED\s+FAILED`, out)
	assert.Regexp(t, `slow-1\s+cli-slow\s+cancelled\s+0\s+\S+\s+\S+\s+`, out)
	assert.Regexp(t, `naps-1\s+cli-naps\s+failed\s+1\s+\S+\s+\S+\s+1 element\n`, out)
	assert.Regexp(t, `greet-1\s+cli-greet\s+succeeded\s+0\s+\S+\s+\S+\s+-\n`, out)
	assert.Less(t, strings.Index(out, "slow-1"), strings.Index(out, "greet-1"), "newest first")
	out, err = cli("workflow", "runs", "-status", "failed", "-o", "json")
	require.NoError(t, err)
	var runs []jetfleet.WorkflowRunSummary
	require.NoError(t, json.Unmarshal([]byte(out), &runs), out)
	require.Len(t, runs, 1)
	assert.Equal(t, "naps-1", runs[0].RunID)
	out, err = cli("workflow", "runs", "-workflow", "cli-greet", "-limit", "1")
	require.NoError(t, err)
	assert.Contains(t, out, "greet-1")
	assert.NotContains(t, out, "naps-1")

	// rm: the definition goes, its runs stay.
	out, err = cli("workflow", "rm", "cli-slow")
	require.NoError(t, err)
	assert.Equal(t, "workflow cli-slow removed\n", out)
	_, err = cli("workflow", "show", "cli-slow")
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
	out, err = cli("workflow", "get", "slow-1")
	require.NoError(t, err)
	assert.Regexp(t, `STATUS\s+cancelled\n`, out)
	assert.Regexp(t, `nap\s+sleep\s+default\s+cancelled\s+`, out)
	_, err = cli("workflow", "get", "nosuch")
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
}
