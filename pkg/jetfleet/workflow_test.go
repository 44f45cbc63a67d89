package jetfleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// The kinds of the nightly export (the design brief's example): list the
// files, export each one, report what succeeded and what failed.
type listFiles struct{}

func (listFiles) Kind() string  { return "list-files" }
func (listFiles) Queue() string { return "export" }

type exportFile struct {
	File string `json:"file"`
}

func (exportFile) Kind() string  { return "export-file" }
func (exportFile) Queue() string { return "export" }

type exportReport struct {
	Succeeded []struct {
		Item string `json:"item"`
	} `json:"succeeded"`
	Failed []struct {
		Item  string `json:"item"`
		Error string `json:"error"`
	} `json:"failed"`
}

func (exportReport) Kind() string  { return "export-report" }
func (exportReport) Queue() string { return "export" }

// exportAgent runs the three kinds and counts what ran: files whose name
// starts with "bad" fail for good until fixed is set.
type exportAgent struct {
	mu      sync.Mutex
	fixed   bool
	exports map[string]int
	reports []exportReport
}

func startExportAgent(t *testing.T, ctx context.Context, nc *nats.Conn, files []string) *exportAgent {
	t.Helper()
	ea := &exportAgent{exports: map[string]int{}}
	a, err := agent.New(nc, agent.Config{Queues: []string{"export"}, Concurrency: 4})
	require.NoError(t, err)
	require.NoError(t, agent.AddHandler(a, func(ctx context.Context, _ *agent.Job, _ listFiles) error {
		return agent.RecordResult(ctx, map[string]any{"files": files})
	}))
	require.NoError(t, agent.AddHandler(a, func(ctx context.Context, _ *agent.Job, f exportFile) error {
		ea.mu.Lock()
		defer ea.mu.Unlock()
		ea.exports[f.File]++
		if strings.HasPrefix(f.File, "bad") && !ea.fixed {
			return agent.NonRetryable(errors.New("disk full while exporting " + f.File))
		}
		return agent.RecordResult(ctx, map[string]any{"rows": len(f.File)})
	}))
	require.NoError(t, agent.AddHandler(a, func(_ context.Context, _ *agent.Job, r exportReport) error {
		ea.mu.Lock()
		defer ea.mu.Unlock()
		ea.reports = append(ea.reports, r)
		return nil
	}))
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() { _ = a.Stop(context.WithoutCancel(ctx)) })
	return ea
}

const nightlyExport = `{
  "name": "nightly-export",
  "description": "export every file, then report",
  "steps": [
    {"name": "list", "kind": "list-files", "queue": "export"},
    {"name": "export", "kind": "export-file", "queue": "export", "depends_on": ["list"],
     "for_each": "{{steps.list.result.files}}", "parallelism": 2, "attempts": 1,
     "input": {"file": "{{item}}"}},
    {"name": "report", "kind": "export-report", "queue": "export", "depends_on": ["export"], "when": "always",
     "input": {"succeeded": "{{steps.export.succeeded}}", "failed": "{{steps.export.failed}}"}}
  ]
}`

// The brief's scenario end to end on a whole fleet (issue 19's acceptance):
// a 50-element fan-out where 5 elements always fail. 45 succeed once each;
// the fan-in runs once and receives exactly the 5 failures with their
// errors; one alert lists all 5; retry-failed re-runs only those 5, then
// the fan-in with the full picture.
func TestWorkflowFanOutFailuresRetryAndOneAlert(t *testing.T) {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var files, bad []string
	badIndex := map[int]bool{3: true, 13: true, 23: true, 33: true, 43: true}
	for i := range 50 {
		name := fmt.Sprintf("file-%02d.csv", i)
		if badIndex[i] {
			name = fmt.Sprintf("bad-%02d.csv", i)
			bad = append(bad, name)
		}
		files = append(files, name)
	}
	ea := startExportAgent(t, ctx, nc, files)
	alerts := make(chan *jetfleetpb.Alert, 100)
	sub, err := nc.Subscribe(protocol.AlertSubject(">"), func(m *nats.Msg) {
		var al jetfleetpb.Alert
		if protocol.Unmarshal(m.Data, &al) == nil {
			alerts <- &al
		}
	})
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	client := jetfleet.NewClient(nc)

	info, err := client.AddWorkflowDocument(ctx, []byte(nightlyExport))
	require.NoError(t, err)
	assert.Equal(t, 3, info.Steps)
	res, err := client.RunWorkflow(ctx, "nightly-export", nil, jetfleet.RunID("night-1"))
	require.NoError(t, err)
	require.Equal(t, "night-1", res.RunID)
	again, err := client.RunWorkflow(ctx, "nightly-export", nil, jetfleet.RunID("night-1"))
	require.NoError(t, err)
	assert.True(t, again.Duplicate, "a second start of the same run id starts nothing")

	run, err := client.WaitWorkflowRun(ctx, "night-1")
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowFailed, run.Status, "five elements failed")
	require.Len(t, run.Failures.Elements, 5)
	for i, f := range run.Failures.Elements {
		assert.Equal(t, "export", f.Step)
		assert.True(t, badIndex[f.Index], "element %d failed", f.Index)
		assert.JSONEq(t, fmt.Sprintf("%q", bad[i]), string(f.Item))
		assert.Contains(t, f.Error, "disk full")
		assert.Equal(t, protocol.WorkflowStepJobID("night-1", "export", f.Index, 0), f.JobID)
	}
	assert.Empty(t, run.Failures.Steps)
	steps := map[string]jetfleet.WorkflowStepView{}
	for _, s := range run.Steps {
		steps[s.Name] = s
	}
	assert.Equal(t, map[string]int{"succeeded": 45, "failed": 5}, steps["export"].Elements)
	assert.Equal(t, jetfleet.WorkflowSucceeded, steps["report"].Status, "report runs always")

	ea.mu.Lock()
	for _, f := range files {
		assert.Equal(t, 1, ea.exports[f], "%s ran once", f)
	}
	require.Len(t, ea.reports, 1, "the fan-in ran once")
	assert.Len(t, ea.reports[0].Succeeded, 45)
	require.Len(t, ea.reports[0].Failed, 5, "exactly the five failures")
	for i, f := range ea.reports[0].Failed {
		assert.Equal(t, bad[i], f.Item)
		assert.Contains(t, f.Error, "disk full while exporting "+bad[i])
	}
	ea.fixed = true
	ea.mu.Unlock()

	al := waitAlert(t, alerts, "workflow_failed")
	assert.Equal(t, "workflow_failed:night-1:0", al.GetKey())
	for _, f := range bad {
		assert.Contains(t, al.GetError(), f, "the one alert lists every failed element")
	}

	runs, err := client.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{Workflow: "nightly-export", Status: "failed"})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, 5, runs[0].FailedElements)

	_, err = client.RetryFailedWorkflowRun(ctx, "night-1")
	require.NoError(t, err)
	run, err = client.WaitWorkflowRun(ctx, "night-1")
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowSucceeded, run.Status)
	assert.Equal(t, 1, run.Round)
	assert.Empty(t, run.Failures.Elements)

	ea.mu.Lock()
	defer ea.mu.Unlock()
	for _, f := range files {
		want := 1
		if strings.HasPrefix(f, "bad") {
			want = 2
		}
		assert.Equal(t, want, ea.exports[f], "only the failed files run again: %s", f)
	}
	require.Len(t, ea.reports, 2, "the fan-in runs again with the full picture")
	assert.Len(t, ea.reports[1].Succeeded, 50)
	assert.Empty(t, ea.reports[1].Failed)
	for len(alerts) > 0 {
		al := <-alerts
		assert.NotEqual(t, "final_failure", al.GetType(), "a step's dead letter is in its run's alert, not one of its own: %s", al.GetSummary())
		assert.NotEqual(t, "workflow_failed:night-1:0", al.GetKey(), "one alert for the run's failures, not a second")
	}
}

func waitAlert(t *testing.T, alerts <-chan *jetfleetpb.Alert, typ string) *jetfleetpb.Alert {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case al := <-alerts:
			if al.GetType() == typ {
				return al
			}
			assert.NotEqual(t, "final_failure", al.GetType(), "a step's dead letter is in its run's alert: %s", al.GetSummary())
		case <-timeout:
			t.Fatalf("no %s alert within 30s", typ)
		}
	}
}

type blockingExport struct {
	File string `json:"file"`
}

func (blockingExport) Kind() string  { return "blocking-export" }
func (blockingExport) Queue() string { return "blocking" }

// Cancelling a run cancels its running job and starts nothing more.
func TestWorkflowCancelStopsTheRunningJob(t *testing.T) {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	started, cancelled := make(chan string, 10), make(chan string, 10)
	a, err := agent.New(nc, agent.Config{Queues: []string{"blocking"}, Concurrency: 2})
	require.NoError(t, err)
	require.NoError(t, agent.AddHandler(a, func(ctx context.Context, _ *agent.Job, b blockingExport) error {
		started <- b.File
		<-ctx.Done()
		cancelled <- b.File
		return ctx.Err()
	}))
	require.NoError(t, a.Start(ctx))
	defer func() { _ = a.Stop(context.WithoutCancel(ctx)) }()
	client := jetfleet.NewClient(nc)

	def := &protocol.WorkflowDefinition{Name: "slow", Steps: []protocol.WorkflowStep{
		{Name: "each", Kind: "blocking-export", Queue: "blocking", ForEach: json.RawMessage(`["x","y","z"]`),
			Parallelism: 1, Input: json.RawMessage(`{"file":"{{item}}"}`)},
		{Name: "after", Kind: "blocking-export", Queue: "blocking", DependsOn: []string{"each"}},
	}}
	_, err = client.AddWorkflow(ctx, def)
	require.NoError(t, err)
	res, err := client.RunWorkflow(ctx, "slow", nil)
	require.NoError(t, err)
	require.NotEmpty(t, res.RunID)
	select {
	case f := <-started:
		assert.Equal(t, "x", f, "parallelism 1: the first element alone")
	case <-ctx.Done():
		t.Fatal("the first element did not start")
	}
	detail, err := client.CancelWorkflowRun(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowCancelled, detail.Status)
	select {
	case f := <-cancelled:
		assert.Equal(t, "x", f)
	case <-ctx.Done():
		t.Fatal("the running element was not cancelled")
	}
	run, err := client.WaitWorkflowRun(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowCancelled, run.Status)
	assert.Equal(t, map[string]int{"cancelled": 3}, run.Steps[0].Elements)
	assert.Equal(t, jetfleet.WorkflowCancelled, run.Steps[1].Status)
	_, err = client.CancelWorkflowRun(ctx, res.RunID)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeConflict), "an ended run")
	assert.Empty(t, started, "nothing starts after the cancel")
}

// Bad definitions and requests are refused with the step and field named.
func TestWorkflowAPIRefusesBadInput(t *testing.T) {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := jetfleet.NewClient(nc)

	_, err := client.AddWorkflowDocument(ctx, []byte(`{"name":"loop","steps":[
		{"name":"a","kind":"echo","depends_on":["b"]},{"name":"b","kind":"echo","depends_on":["a"]}]}`))
	require.ErrorIs(t, err, protocol.Code(protocol.CodeInvalidArgument))
	assert.Contains(t, err.Error(), "cycle")
	_, err = client.AddWorkflowDocument(ctx, []byte(`{"name":"x","steps":[{"name":"a","kind":"echo","colour":"red"}]}`))
	require.ErrorIs(t, err, protocol.Code(protocol.CodeInvalidArgument))
	assert.Contains(t, err.Error(), "colour")
	_, err = client.RunWorkflow(ctx, "nope", nil)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
	_, err = client.WorkflowRun(ctx, "no-such-run")
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
	_, err = client.RunWorkflow(ctx, "nope", nil, jetfleet.RunID("has.dot"))
	require.ErrorIs(t, err, protocol.Code(protocol.CodeInvalidArgument))
	assert.Contains(t, err.Error(), "run_id")

	_, err = client.AddWorkflowDocument(ctx, []byte(`{"name":"one","steps":[{"name":"only","kind":"echo"}]}`))
	require.NoError(t, err)
	list, err := client.Workflows(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "one", list[0].Name)
	run, err := client.RunWorkflow(ctx, "one", map[string]string{"hello": "world"})
	require.NoError(t, err)
	done, err := client.WaitWorkflowRun(ctx, run.RunID)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowSucceeded, done.Status, "the dev agent's echo")
	_, err = client.RetryFailedWorkflowRun(ctx, run.RunID)
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeConflict), "nothing failed")
	require.NoError(t, client.RemoveWorkflow(ctx, "one"))
	_, err = client.Workflow(ctx, "one")
	assert.ErrorIs(t, err, protocol.Code(protocol.CodeNotFound))
	kept, err := client.WorkflowRun(ctx, run.RunID)
	require.NoError(t, err, "a run outlives its definition")
	assert.Equal(t, jetfleet.WorkflowSucceeded, kept.Status)
}

// A run starts from one plain message on workflows.<name> (run id from
// Jetfleet-Run-Id, else the message id), and from a schedule whose target
// is a workflow: that run stands for the fire's job, whose status is the
// run's. A message that cannot start a run becomes a failed run saying why.
func TestWorkflowStartedByAMessageAndByASchedule(t *testing.T) {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := jetfleet.NewClient(nc)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = client.AddWorkflowDocument(ctx, []byte(`{"name":"greet","steps":[{"name":"hello","kind":"echo","input":{"to":"{{input.who}}"}}]}`))
	require.NoError(t, err)

	publish := func(subject, msgID, runID, body string) {
		t.Helper()
		msg := nats.NewMsg(subject)
		msg.Data = []byte(body)
		if msgID != "" {
			msg.Header.Set(protocol.HeaderMsgID, msgID)
		}
		if runID != "" {
			msg.Header.Set(protocol.HeaderRunID, runID)
		}
		_, err := js.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}
	publish("workflows.greet", "greet-1", "", `{"who":"ada"}`)
	run, err := client.WaitWorkflowRun(ctx, "greet-1")
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowSucceeded, run.Status)
	assert.JSONEq(t, `{"who":"ada"}`, string(run.Input))

	publish("workflows.greet", "greet-again", "greet-1", `{"who":"bob"}`) // the run id exists: nothing starts
	publish("workflows.nope", "nope-1", "", `{}`)
	publish("workflows.greet", "bad-body", "", `not json`)
	workflows, err := js.Stream(ctx, protocol.StreamWorkflows)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := workflows.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 20*time.Second, 20*time.Millisecond, "the supervisor takes every start message")
	runs, err := client.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{Workflow: "greet"})
	require.NoError(t, err)
	require.Len(t, runs, 2, "greet-1 once, and the refused bad-body")
	refused, err := client.WorkflowRun(ctx, "nope-1")
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowFailed, refused.Status)
	assert.Contains(t, refused.Error, `no workflow "nope"`)
	refused, err = client.WorkflowRun(ctx, "bad-body")
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowFailed, refused.Status)
	assert.Contains(t, refused.Error, "not JSON")

	_, err = client.AddSchedule(ctx, &jetfleet.Schedule{ID: "greet-hourly", Spec: jetfleet.Spec{Cron: "0 * * * *"},
		Target: jetfleet.Target{Workflow: "greet", Payload: json.RawMessage(`{"who":"the schedule"}`)},
		Policy: jetfleet.Policy{Overlap: jetfleet.OverlapSkip}})
	require.NoError(t, err)
	fired, err := client.TriggerSchedule(ctx, "greet-hourly")
	require.NoError(t, err)
	job, err := client.Wait(ctx, fired.JobID)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.JobSucceeded, job.State, "the fire's job ends as its run does")
	// The leader reports the run's end (the fire's job among it) before it
	// stores the ended run, so that a successor redoes what a crash between
	// the two left undone: the listing shows the end a moment later.
	require.Eventually(t, func() bool {
		runs, err = client.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{Workflow: "greet", Status: "succeeded"})
		return err == nil && len(runs) == 2
	}, 10*time.Second, 20*time.Millisecond, "both runs listed as succeeded")
	assert.Equal(t, fired.JobID, runs[0].JobID, "the newest run stands for the fire's job")
	assert.Equal(t, "greet-hourly", runs[0].ScheduleID)

	_, err = client.AddSchedule(ctx, &jetfleet.Schedule{ID: "greet-bad", Spec: jetfleet.Spec{Cron: "0 * * * *"},
		Target: jetfleet.Target{Workflow: "greet"}, Policy: jetfleet.Policy{Overlap: jetfleet.OverlapCancelPrevious}})
	require.ErrorIs(t, err, protocol.Code(protocol.CodeInvalidArgument))
	assert.Contains(t, err.Error(), "policy.overlap")
	_, err = client.AddSchedule(ctx, &jetfleet.Schedule{ID: "greet-bad", Spec: jetfleet.Spec{Cron: "0 * * * *"},
		Target: jetfleet.Target{Workflow: "greet", Kind: "echo"}})
	require.ErrorIs(t, err, protocol.Code(protocol.CodeInvalidArgument))
	assert.Contains(t, err.Error(), "target.kind")
}

// The builder's mistakes and the definition's come back from Definition,
// naming the step and the field.
func TestWorkflowBuilderRefusesABadDefinition(t *testing.T) {
	wf := jetfleet.NewWorkflow("loop")
	a := wf.Step("a", "echo")
	b := wf.Step("b", "echo").After(a)
	a.After(b)
	_, err := wf.Definition()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cycle")

	wf = jetfleet.NewWorkflow("bad-input")
	wf.Step("a", "echo").Input(func() {})
	_, err = wf.Definition()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "step a: input")

	wf = jetfleet.NewWorkflow("fine")
	first := jetfleet.StepFor[exportFile](wf, "first").Timeout(time.Minute).Backoff(time.Second, 30*time.Second).
		ForEach([]string{"x"}).FailFast()
	wf.Step("second", "echo").After(first).ForEach([]int{1, 2}).When(protocol.WhenAlways)
	def, err := wf.Definition()
	require.NoError(t, err)
	assert.Equal(t, "export", def.Steps[0].Queue, "StepFor takes the args type's queue")
	assert.Equal(t, "export-file", def.Steps[0].Kind)
	assert.Equal(t, []string{"1s", "30s"}, def.Steps[0].Backoff)
	assert.Equal(t, "1m0s", def.Steps[0].Timeout)
	assert.Equal(t, protocol.ElementFailureFailFast, def.Steps[0].OnElementFailure)
	assert.JSONEq(t, `[1,2]`, string(def.Steps[1].ForEach))
}
