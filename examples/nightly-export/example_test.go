package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent/agentservice"
	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/service"
)

func TestMain(m *testing.M) {
	natstest.VerifyNoLeaks(m)
}

// fixedRefunds is refunds.csv as README.md fixes it: its last row complete.
const fixedRefunds = "id,order,amount\nr-1,1001,19.90\nr-2,1003,42.00\n"

// demoBackoff replaces the workflow's 30 s between attempts, as README.md
// shows with sed.
const demoBackoff = `"1s"`

// example is the README's setup: a dev fleet, the Go agent, the exec agent
// running export-file.sh from agent.yaml, and the sample files.
type example struct {
	dir    string
	url    string // the fleet's NATS server
	client *jetfleet.Client
	alerts chan *jetfleetpb.Alert
}

// setup starts the dev fleet, writes the sample files and starts both
// agents, as README.md's manual way does.
func setup(t *testing.T) *example {
	t.Helper()
	ex := startFleet(t)
	ctx := fleettest.Ctx(t, time.Minute)
	dir := ex.dir
	require.NoError(t, WriteSamples(dir))
	nc, err := nats.Connect(ex.url)
	require.NoError(t, err)
	t.Cleanup(nc.Close)

	// go run ./examples/nightly-export -samples (the samples are written above)
	a, err := NewAgent(nc, Config{Dir: dir, AgentID: "nightly-export-go"}, fleettest.Logger(t).With("agent", "go"))
	require.NoError(t, err)
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() { stopWithin(t, a.Stop) })

	// go run ./services/agent -config config/fleet.yaml -config examples/nightly-export/agent.yaml -set …
	script, err := filepath.Abs("export-file.sh")
	require.NoError(t, err)
	agentCfg := agentservice.DefaultServiceConfig()
	_, err = config.Load(agentCfg, config.Options{
		Files: []string{filepath.Join("..", "..", "config", "fleet.yaml"), "agent.yaml"},
		Sets: []string{"nats.url=" + ex.url, "telemetry.http_addr=", "handlers.export-file.command=" + script,
			"handlers.export-file.env.NIGHTLY_EXPORT_DIR=" + dir},
		Environ: []string{},
	})
	require.NoError(t, err)
	env, err := service.Connect(ctx, "agent", &agentCfg.Base, nil, fleettest.Logger(t).With("agent", "exec"))
	require.NoError(t, err)
	t.Cleanup(env.Close)
	component, err := agentservice.BuildFunc(agentCfg)(ctx, env, nil)
	require.NoError(t, err)
	execAgent := component.(*agentservice.Service)
	require.Equal(t, []string{"export-file"}, execAgent.Agent().Kinds())
	require.NoError(t, execAgent.Start(ctx))
	t.Cleanup(func() { stopWithin(t, execAgent.Stop) })
	return ex
}

// startFleet starts the dev fleet alone (go tool task dev), with a client
// that collects every alert; ex.dir is an empty directory for the files.
func startFleet(t *testing.T) *example {
	t.Helper()
	ctx := fleettest.Ctx(t, time.Minute)
	dir := t.TempDir()

	// go tool task dev
	cfg := devfleet.DefaultConfig()
	cfg.Embedded.Port, cfg.Embedded.DataDir, cfg.Telemetry.HTTPAddr = -1, t.TempDir(), ""
	cfg.Dashboard.Listen = devfleet.DashboardOff
	fleet, err := devfleet.New(cfg, devfleet.Options{Logger: fleettest.Logger(t).With("fleet", "dev")})
	require.NoError(t, err)
	require.NoError(t, fleet.Start(ctx))
	t.Cleanup(func() { stopWithin(t, fleet.Stop) })
	nc, err := nats.Connect(fleet.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	ex := &example{dir: dir, url: fleet.ClientURL(), client: jetfleet.NewClient(nc), alerts: make(chan *jetfleetpb.Alert, 100)}
	sub, err := nc.Subscribe(protocol.AlertSubject(">"), func(m *nats.Msg) {
		var al jetfleetpb.Alert
		if protocol.Unmarshal(m.Data, &al) == nil {
			ex.alerts <- &al
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return ex
}

// stopWithin stops a component within 30 s.
func stopWithin(t *testing.T, stop func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	assert.NoError(t, stop(ctx))
}

// TestNightlyExport runs what README.md shows, on a dev fleet in this
// process: the workflow (its retries shortened as the README does) started
// by its schedule's trigger; every listed file exported once by the shell
// program, the corrupt one failed after its 3 attempts and listed in the
// run's failures, the report given both lists, one alert; then, the file
// fixed, retry-failed exports only it and reports again with every file.
func TestNightlyExport(t *testing.T) {
	ex := setup(t)
	ctx := fleettest.Ctx(t, 2*time.Minute)
	client := ex.client

	// jetfleet workflow add -f - (workflow.json with its backoff shortened)
	def, err := os.ReadFile("workflow.json")
	require.NoError(t, err)
	require.Equal(t, 1, bytes.Count(def, []byte(`"30s"`)), "the backoff the README's sed shortens")
	info, err := client.AddWorkflowDocument(ctx, bytes.ReplaceAll(def, []byte(`"30s"`), []byte(demoBackoff)))
	require.NoError(t, err)
	require.Equal(t, "nightly-export", info.Name)
	require.Equal(t, 3, info.Steps)

	// jetfleet schedule add -f schedule.json: nightly at 02:00 in Berlin.
	doc, err := os.ReadFile("schedule.json")
	require.NoError(t, err)
	sched, err := jetfleet.DecodeSchedule(doc)
	require.NoError(t, err)
	stored, err := client.AddSchedule(ctx, sched)
	require.NoError(t, err)
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	require.NotEmpty(t, stored.NextFires)
	for _, next := range stored.NextFires {
		assert.Equal(t, "02:00", next.In(berlin).Format("15:04"), "%s", next)
	}

	// jetfleet schedule trigger nightly-export: the run stands for the
	// fire's job, which ends dead because a file failed.
	fired, err := client.TriggerSchedule(ctx, "nightly-export")
	require.NoError(t, err)
	require.Equal(t, "fired", fired.Outcome)
	_, err = client.Wait(ctx, fired.JobID)
	var failed *jetfleet.JobFailedError
	require.ErrorAs(t, err, &failed)
	assert.Equal(t, "workflow_failed", failed.Job.Reason, "docs/protocol.md §8.2")

	// jetfleet workflow runs -workflow nightly-export; jetfleet workflow get <run>
	// The run is listed from its start (still running, perhaps: the leader
	// reports the run's end before it stores it, docs/workflows.md).
	runs, err := client.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{Workflow: "nightly-export"})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	runID := runs[0].RunID
	assert.Equal(t, fired.JobID, runs[0].JobID)
	assert.Equal(t, "nightly-export", runs[0].ScheduleID)
	run, err := client.WaitWorkflowRun(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, jetfleet.WorkflowFailed, run.Status)
	assert.JSONEq(t, `{"pattern":"*.csv"}`, string(run.Input), "the schedule's payload")
	steps := stepsByName(run)
	require.Equal(t, jetfleet.WorkflowSucceeded, steps["list"].Status)
	assert.JSONEq(t, `{"files":["customers.csv","invoices.csv","orders.csv","refunds.csv","stock.csv"]}`,
		string(steps["list"].Result))
	assert.Equal(t, map[string]int{"succeeded": 4, "failed": 1}, steps["export"].Elements)

	require.Len(t, run.Failures.Elements, 1)
	corrupt := run.Failures.Elements[0]
	assert.Equal(t, "export", corrupt.Step)
	assert.JSONEq(t, `"refunds.csv"`, string(corrupt.Item))
	assert.Equal(t, 3, corrupt.Index)
	assert.Equal(t, protocol.WorkflowStepJobID(runID, "export", 3, 0), corrupt.JobID)
	assert.Contains(t, corrupt.Error, "exit status 1")
	assert.Empty(t, run.Failures.Steps)
	// jetfleet jobs get <element job>: its 3 attempts, and why in its output.
	job, err := client.Job(ctx, corrupt.JobID)
	require.NoError(t, err)
	assert.Equal(t, protocol.EventDead, job.State)
	assert.Equal(t, protocol.ReasonMaxAttempts, job.Reason)
	assert.Equal(t, 3, job.Attempt)
	assert.Equal(t, 3, job.MaxAttempts)
	assert.Contains(t, job.Event.GetOutputTail(), "refunds.csv: line 3 has 2 fields where the header has 3: corrupt, not exported")

	// Every other file exported exactly once, as JSON lines.
	out := filepath.Join(ex.dir, "out", runID)
	assert.Equal(t, map[string]int{"customers.csv": 1, "invoices.csv": 1, "orders.csv": 1, "stock.csv": 1}, exportCounts(t, out))
	orders, err := os.ReadFile(filepath.Join(out, "orders.jsonl"))
	require.NoError(t, err)
	assert.Equal(t, `{"id":"1001","customer":"ada","total":"19.90"}`+"\n"+`{"id":"1002","customer":"grace","total":"5.00"}`+"\n"+
		`{"id":"1003","customer":"linus","total":"42.00"}`+"\n", string(orders))
	assert.NoFileExists(t, filepath.Join(out, "refunds.jsonl"))

	// The report ran although an element failed, and got both lists.
	require.Equal(t, jetfleet.WorkflowSucceeded, steps["report"].Status)
	assert.Equal(t, ReportResult{Run: runID, Exported: []string{"customers.csv", "invoices.csv", "orders.csv", "stock.csv"},
		Failed: []string{"refunds.csv"}, Report: filepath.Join(out, "report.txt")}, reportResult(t, steps["report"]))
	report := readFile(t, filepath.Join(out, "report.txt"))
	assert.Contains(t, report, "nightly export, run "+runID+": 4 of 5 files exported\n")
	assert.Contains(t, report, "exported  orders.csv  3 rows\n")
	assert.Contains(t, report, "FAILED    refunds.csv  ")

	// One alert for the run, naming the file; none for the element's own
	// dead letter.
	al := waitAlert(t, ex.alerts, "workflow_failed")
	assert.Equal(t, "workflow_failed:"+runID+":0", al.GetKey())
	assert.Contains(t, al.GetError(), "refunds.csv")

	// An export is idempotent: the same file of the same run again (an
	// agent that died before its success was stored) skips.
	again, err := client.Enqueue(ctx, exportFile{File: "orders.csv", Run: runID})
	require.NoError(t, err)
	done, err := client.Wait(ctx, again.JobID)
	require.NoError(t, err)
	assert.JSONEq(t, `{"file":"orders.csv","rows":3,"skipped":true}`, string(done.Result))
	assert.Equal(t, 1, exportCounts(t, out)["orders.csv"], "not exported again")

	// Fix the file, then: jetfleet workflow retry-failed <run>
	require.NoError(t, os.WriteFile(filepath.Join(ex.dir, "in", "refunds.csv"), []byte(fixedRefunds), 0o644))
	_, err = client.RetryFailedWorkflowRun(ctx, runID)
	require.NoError(t, err)
	run, err = client.WaitWorkflowRun(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, jetfleet.WorkflowSucceeded, run.Status)
	assert.Equal(t, 1, run.Round)
	assert.Empty(t, run.Failures.Elements)
	steps = stepsByName(run)
	assert.Equal(t, map[string]int{"succeeded": 5}, steps["export"].Elements)
	assert.Equal(t, map[string]int{"customers.csv": 1, "invoices.csv": 1, "orders.csv": 1, "refunds.csv": 1, "stock.csv": 1},
		exportCounts(t, out), "only the failed file ran again")
	assert.Equal(t, ReportResult{Run: runID, Exported: []string{"customers.csv", "invoices.csv", "orders.csv", "refunds.csv", "stock.csv"},
		Failed: []string{}, Report: filepath.Join(out, "report.txt")}, reportResult(t, steps["report"]), "the report again, with every file")
	assert.Contains(t, readFile(t, filepath.Join(out, "report.txt")), "nightly export, run "+runID+": 5 of 5 files exported\n")
	require.Eventually(t, func() bool {
		job, err := client.Job(ctx, fired.JobID)
		return err == nil && job.State == protocol.EventSucceeded
	}, 30*time.Second, 50*time.Millisecond, "the fire's job ends as the run's last round")

	for len(ex.alerts) > 0 {
		al := <-ex.alerts
		assert.NotEqual(t, "workflow_failed", al.GetType(), "one alert per failed round: %s", al.GetKey())
		assert.NotEqual(t, "final_failure", al.GetType(), "an element's dead letter is in its run's alert: %s", al.GetSummary())
	}
}

// TestDemo runs `go run ./examples/nightly-export -demo` (RunDemo) against
// a dev fleet in this process, as against `go tool task dev`, with the
// backoff shortened to 1 s: it starts its own agents, fires the schedule
// and returns no error although a file failed; what it prints names the
// run, refunds.csv with its error and the shell program's reason, and where
// the list is stored, with the commands to read it and to retry it.
func TestDemo(t *testing.T) {
	ex := startFleet(t)
	ctx := fleettest.Ctx(t, 2*time.Minute)
	// A refunds.csv fixed by an earlier try is corrupt again for the demo.
	require.NoError(t, os.MkdirAll(filepath.Join(ex.dir, "in"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(ex.dir, "in", "refunds.csv"), []byte(fixedRefunds), 0o644))

	var out bytes.Buffer
	require.NoError(t, RunDemo(ctx, DemoConfig{URL: ex.url, Dir: ex.dir, ExampleDir: ".", Backoff: time.Second}, &out,
		fleettest.Logger(t).With("demo", "agents")), "a failed file is the demo's expected outcome")
	printed := out.String()
	t.Logf("printed:\n%s", printed)

	runs, err := ex.client.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{Workflow: "nightly-export"})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	runID := runs[0].RunID
	assert.Equal(t, "nightly-export", runs[0].ScheduleID, "started by firing the schedule")
	assert.Equal(t, jetfleet.WorkflowFailed, runs[0].Status)
	info, err := ex.client.Workflow(ctx, "nightly-export")
	require.NoError(t, err)
	assert.Equal(t, []string{"1s"}, info.Definition.Steps[1].Backoff, "stored with the demo's backoff")

	assert.Contains(t, printed, "\nrun "+runID+" of workflow nightly-export: failed after ")
	assert.Contains(t, printed, "step export: 4 of 5 files exported, 1 failed\n")
	assert.Regexp(t, `\nrefunds\.csv +error: +max_attempts: exec: \S+/export-file\.sh: exit status 1\n`, printed)
	assert.Contains(t, printed, "output:  refunds.csv: line 3 has 2 fields where the header has 3: corrupt, not exported\n")
	assert.Contains(t, printed, "job:     "+protocol.WorkflowStepJobID(runID, "export", 3, 0))
	for _, name := range []string{"customers.csv", "invoices.csv", "orders.csv", "stock.csv"} {
		assert.NotContains(t, printed, name, "only the failed file is listed")
	}
	assert.Contains(t, printed, "is key "+runID+" in bucket workflow_runs")
	assert.Contains(t, printed, "go run ./services/jetfleet workflow get "+runID+" ")
	assert.Contains(t, printed, "go run ./services/jetfleet workflow retry-failed "+runID+" ")
	report := filepath.Join(ex.dir, "out", runID, "report.txt")
	assert.Contains(t, printed, report)
	assert.Contains(t, readFile(t, report), "FAILED    refunds.csv  ")
	al := waitAlert(t, ex.alerts, "workflow_failed")
	assert.Equal(t, "workflow_failed:"+runID+":0", al.GetKey(), "the run's one alert")

	// Run again on the same fleet, the schedule stored by the first: it is
	// stored again, and fired again.
	out.Reset()
	require.NoError(t, RunDemo(ctx, DemoConfig{URL: ex.url, Dir: ex.dir, ExampleDir: ".", Backoff: time.Second}, &out,
		fleettest.Logger(t).With("demo", "again")), "a second demo")
	runs, err = ex.client.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{Workflow: "nightly-export"})
	require.NoError(t, err)
	assert.Len(t, runs, 2, "a run for each demo")
}

// exportFile are the arguments of a job of export-file sent by hand.
type exportFile struct {
	File string `json:"file"`
	Run  string `json:"run"`
}

func (exportFile) Kind() string  { return "export-file" }
func (exportFile) Queue() string { return "export-files" }

func stepsByName(run *jetfleet.WorkflowRunDetail) map[string]jetfleet.WorkflowStepView {
	steps := map[string]jetfleet.WorkflowStepView{}
	for _, s := range run.Steps {
		steps[s.Name] = s
	}
	return steps
}

// exportCounts counts the lines of exported.log by file: one per export.
func exportCounts(t *testing.T, out string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, line := range strings.Fields(readFile(t, filepath.Join(out, "exported.log"))) {
		counts[line]++
	}
	return counts
}

func reportResult(t *testing.T, step jetfleet.WorkflowStepView) ReportResult {
	t.Helper()
	var res ReportResult
	require.NoError(t, json.Unmarshal(step.Result, &res), "%s", step.Result)
	return res
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(data)
}

// waitAlert returns the first alert of type typ, failing on a final_failure
// alert before it.
func waitAlert(t *testing.T, alerts <-chan *jetfleetpb.Alert, typ string) *jetfleetpb.Alert {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case al := <-alerts:
			if al.GetType() == typ {
				return al
			}
			assert.NotEqual(t, "final_failure", al.GetType(), "an element's dead letter is in its run's alert: %s", al.GetSummary())
		case <-timeout:
			t.Fatalf("no %s alert within 30s", typ)
		}
	}
}
