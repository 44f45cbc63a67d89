package workflow

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

const nightly = `{"name":"nightly-export","steps":[
  {"name":"list","kind":"list-files"},
  {"name":"export","kind":"export-file","depends_on":["list"],"for_each":"{{steps.list.result.files}}",
   "parallelism":10,"attempts":3,"backoff":["30s"],"input":{"file":"{{item}}"}},
  {"name":"report","kind":"report","depends_on":["export"],"input":{"failed":"{{steps.export.failed}}","ok":"{{steps.export.succeeded}}"}},
  {"name":"page","kind":"alert","depends_on":["export"],"when":"on_failure"}]}`

func parse(t *testing.T, doc string) protocol.WorkflowDefinition {
	t.Helper()
	def, err := protocol.ParseWorkflowDefinition([]byte(doc))
	require.NoError(t, err)
	return *def
}

// fleet plays the agents: it answers every published job with outcome and
// counts how often each job id was published and how many ran at once per
// step. It stores and reloads the run between transitions, as a supervisor
// that loses leadership would.
type fleet struct {
	t         *testing.T
	run       *Run
	outcome   func(Job) Outcome
	published map[string]int
	payloads  map[string][]json.RawMessage // by step
	running   map[string]int               // by step
	maxRun    map[string]int
	queue     []Job
	alerts    []Failures
	cancelled []string
}

func newFleet(t *testing.T, run *Run, acts Actions, outcome func(Job) Outcome) *fleet {
	f := &fleet{t: t, run: run, outcome: outcome, published: map[string]int{}, payloads: map[string][]json.RawMessage{},
		running: map[string]int{}, maxRun: map[string]int{}}
	f.apply(acts)
	return f
}

func (f *fleet) apply(acts Actions) {
	for _, j := range acts.Publish {
		f.published[j.ID]++
		f.payloads[j.Step] = append(f.payloads[j.Step], j.Payload)
		f.running[j.Step]++
		f.maxRun[j.Step] = max(f.maxRun[j.Step], f.running[j.Step])
		f.queue = append(f.queue, j)
	}
	f.cancelled = append(f.cancelled, acts.Cancel...)
	if acts.Alert != nil {
		f.alerts = append(f.alerts, *acts.Alert)
	}
}

// drain answers jobs in publishing order until none is left.
func (f *fleet) drain() {
	for len(f.queue) > 0 {
		j := f.queue[0]
		f.queue = f.queue[1:]
		f.running[j.Step]--
		if contains(f.cancelled, j.ID) {
			continue
		}
		f.end(j.ID, f.outcome(j))
	}
}

func (f *fleet) end(jobID string, out Outcome) {
	f.t.Helper()
	f.reload()
	acts, err := f.run.JobEnded(jobID, out)
	require.NoError(f.t, err)
	f.apply(acts)
}

// reload stores the run as JSON and reads it back.
func (f *fleet) reload() {
	b, err := json.Marshal(f.run)
	require.NoError(f.t, err)
	var r Run
	require.NoError(f.t, json.Unmarshal(b, &r))
	f.run = &r
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func files(n int) json.RawMessage {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("file-%02d.csv", i)
	}
	b, _ := json.Marshal(map[string]any{"files": names})
	return b
}

// alwaysFailing fails files 3, 13, 23, 33 and 43 of the nightly export.
func alwaysFailing(round int) func(Job) Outcome {
	return func(j Job) Outcome {
		switch j.Step {
		case "list":
			return Outcome{Status: StatusSucceeded, Result: files(50)}
		case "export":
			if j.Element%10 == 3 && round == 0 {
				return Outcome{Status: StatusFailed, Error: "disk full"}
			}
			return Outcome{Status: StatusSucceeded, Result: json.RawMessage(`{"rows":1}`)}
		}
		return Outcome{Status: StatusSucceeded}
	}
}

func TestFanOutWithFailingElementsAlertsOnceAndRetriesOnlyThem(t *testing.T) {
	run, acts, err := Start(parse(t, nightly), "r1", json.RawMessage(`{"bucket":"b"}`))
	require.NoError(t, err)
	f := newFleet(t, run, acts, alwaysFailing(0))
	f.drain()

	assert.Equal(t, StatusFailed, f.run.Status)
	for i := range 50 {
		assert.Equal(t, 1, f.published[protocol.WorkflowStepJobID("r1", "export", i, 0)], "element %d", i)
	}
	assert.Equal(t, 10, f.maxRun["export"], "parallelism holds")
	require.Len(t, f.payloads["report"], 1, "the fan-in runs once")
	var report struct {
		Failed []protocol.WorkflowElementFailure `json:"failed"`
		OK     []protocol.WorkflowElementResult  `json:"ok"`
	}
	require.NoError(t, json.Unmarshal(f.payloads["report"][0], &report))
	require.Len(t, report.Failed, 5)
	assert.Len(t, report.OK, 45)
	for i, fe := range report.Failed {
		assert.Equal(t, 3+10*i, fe.Index)
		assert.Equal(t, fmt.Sprintf("file-%02d.csv", 3+10*i), fe.Item)
		assert.Equal(t, "disk full", fe.Error)
	}
	require.Len(t, f.payloads["page"], 1, "an on_failure step runs when elements failed")
	require.Len(t, f.alerts, 1, "one alert for the run")
	require.Len(t, f.alerts[0].Elements, 5)
	assert.Empty(t, f.alerts[0].Steps)
	assert.JSONEq(t, `"file-43.csv"`, string(f.alerts[0].Elements[4].Item))

	// The operator retries the failed files; this time they succeed.
	f.outcome = alwaysFailing(1)
	acts, err = f.run.RetryFailed()
	require.NoError(t, err)
	require.Len(t, acts.Publish, 5, "only the failed elements")
	for _, j := range acts.Publish {
		assert.Equal(t, 3, j.Element%10)
		assert.True(t, strings.HasSuffix(j.ID, "~1"), j.ID)
	}
	f.apply(acts)
	f.drain()
	assert.Equal(t, StatusSucceeded, f.run.Status)
	require.Len(t, f.payloads["report"], 2, "the fan-in runs again with the whole picture")
	require.NoError(t, json.Unmarshal(f.payloads["report"][1], &report))
	assert.Empty(t, report.Failed)
	assert.Len(t, report.OK, 50)
	assert.Len(t, f.payloads["page"], 1, "nothing failed this round: the on_failure step is skipped")
	assert.Equal(t, StatusSkipped, f.run.Steps["page"].Status)
	assert.Len(t, f.alerts, 1, "no second alert")
	for i := range 50 {
		assert.Equal(t, 1, f.published[protocol.WorkflowStepJobID("r1", "export", i, 0)], "element %d ran once in round 0", i)
	}

	_, err = f.run.RetryFailed()
	assert.EqualError(t, err, "nothing failed in this run")
}

func TestDuplicateAndStaleOutcomesChangeNothing(t *testing.T) {
	run, acts, err := Start(parse(t, nightly), "r1", nil)
	require.NoError(t, err)
	require.Len(t, acts.Publish, 1)
	list := acts.Publish[0].ID
	acts, err = run.JobEnded(list, Outcome{Status: StatusSucceeded, Result: files(3)})
	require.NoError(t, err)
	require.Len(t, acts.Publish, 3)

	again, err := run.JobEnded(list, Outcome{Status: StatusSucceeded, Result: files(7)})
	require.NoError(t, err)
	assert.Empty(t, again.Publish, "a second succeeded event of the list job (a replay after failover)")
	assert.Len(t, run.Steps["export"].Elements, 3)

	stale, err := run.JobEnded(protocol.WorkflowStepJobID("r1", "export", 0, 4), Outcome{Status: StatusFailed, Error: "x"})
	require.NoError(t, err)
	assert.Empty(t, stale.Publish)
	assert.Equal(t, StatusRunning, run.Steps["export"].Elements[0].Status, "an outcome of another round is not this one's")

	_, err = run.JobEnded("wf:other:list", Outcome{Status: StatusSucceeded})
	assert.ErrorContains(t, err, "is not a job of run r1")
	_, err = run.JobEnded("wf:r1:export", Outcome{Status: StatusSucceeded})
	assert.ErrorContains(t, err, "step export is a fan-out")
	_, err = run.JobEnded("wf:r1:nope", Outcome{Status: StatusSucceeded})
	assert.ErrorContains(t, err, `run r1 has no step "nope"`)
}

func TestDiamondPassesBothResultsToTheJoin(t *testing.T) {
	def := parse(t, `{"name":"diamond","steps":[
		{"name":"a","kind":"k"},
		{"name":"b","kind":"k","depends_on":["a"],"input":"{{steps.a.result}}"},
		{"name":"c","kind":"k","depends_on":["a"]},
		{"name":"d","kind":"k","depends_on":["b","c"],"input":{"b":"{{steps.b.result}}","c":"{{steps.c.result}}"}}]}`)
	run, acts, err := Start(def, "d1", json.RawMessage(`{"n":1}`))
	require.NoError(t, err)
	f := newFleet(t, run, acts, func(j Job) Outcome {
		return Outcome{Status: StatusSucceeded, Result: json.RawMessage(fmt.Sprintf(`{"from":%q}`, j.Step))}
	})
	f.drain()
	assert.Equal(t, StatusSucceeded, f.run.Status)
	require.Len(t, f.payloads["d"], 1)
	assert.JSONEq(t, `{"b":{"from":"b"},"c":{"from":"c"}}`, string(f.payloads["d"][0]))
	assert.JSONEq(t, `{"from":"a"}`, string(f.payloads["b"][0]))
	assert.JSONEq(t, `{"n":1}`, string(f.payloads["c"][0]), "without an input template, the run's input")
	assert.Empty(t, f.alerts)
}

func TestFailFastCancelsTheRestAndSkipsWhatDependsOnSuccess(t *testing.T) {
	def := parse(t, `{"name":"ff","steps":[
		{"name":"fan","kind":"k","for_each":[0,1,2,3,4,5,6,7,8,9],"parallelism":3,"on_element_failure":"fail_fast"},
		{"name":"after","kind":"k","depends_on":["fan"]},
		{"name":"later","kind":"k","depends_on":["after"]},
		{"name":"undo","kind":"compensate","depends_on":["later"],"when":"on_failure"},
		{"name":"cleanup","kind":"k","depends_on":["fan"],"when":"always"}]}`)
	run, acts, err := Start(def, "f1", nil)
	require.NoError(t, err)
	require.Len(t, acts.Publish, 3)
	f := newFleet(t, run, acts, func(j Job) Outcome {
		if j.Element == 1 {
			return Outcome{Status: StatusFailed, Error: "boom"}
		}
		return Outcome{Status: StatusSucceeded}
	})
	f.drain()
	assert.Equal(t, StatusFailed, f.run.Status)
	assert.Equal(t, StatusFailed, f.run.Steps["fan"].Status)
	assert.Equal(t, []string{protocol.WorkflowStepJobID("f1", "fan", 2, 0), protocol.WorkflowStepJobID("f1", "fan", 3, 0)},
		f.cancelled, "the elements running when element 1 failed")
	assert.Len(t, f.payloads["fan"], 4, "elements 0-2, then 3 when 0 ended; none after the failure")
	assert.Equal(t, StatusSkipped, f.run.Steps["after"].Status)
	assert.Equal(t, StatusSkipped, f.run.Steps["later"].Status)
	assert.Len(t, f.payloads["undo"], 1, "on_failure runs below a step skipped for a failure")
	assert.Len(t, f.payloads["cleanup"], 1)
	require.Len(t, f.alerts, 1)
	assert.Equal(t, []StepFailure{{Step: "fan", Error: "1 of 10 elements failed, the rest cancelled (fail_fast)"}}, f.alerts[0].Steps)
	require.Len(t, f.alerts[0].Elements, 9, "the failed element and the eight that fail_fast cancelled")
	assert.Equal(t, "boom", f.alerts[0].Elements[0].Error)
	assert.Equal(t, "fail_fast: another element failed", f.alerts[0].Elements[8].Error)
}

func TestAJobCancelledOnItsOwnFailsTheRun(t *testing.T) {
	def := parse(t, `{"name":"c","steps":[{"name":"a","kind":"k"},{"name":"b","kind":"k","depends_on":["a"]},
		{"name":"undo","kind":"k","depends_on":["a"],"when":"on_failure"}]}`)
	run, acts, err := Start(def, "x1", nil)
	require.NoError(t, err)
	acts, err = run.JobEnded(acts.Publish[0].ID, Outcome{Status: StatusCancelled, Error: "cancelled by alice"})
	require.NoError(t, err)
	require.Len(t, acts.Publish, 1)
	assert.Equal(t, "undo", acts.Publish[0].Step, "a cancelled step counts as a failure for on_failure steps")
	acts, err = run.JobEnded(acts.Publish[0].ID, Outcome{Status: StatusSucceeded})
	require.NoError(t, err)
	assert.True(t, acts.Ended)
	assert.Equal(t, StatusFailed, run.Status)
	require.NotNil(t, acts.Alert)
	assert.Equal(t, []StepFailure{{Step: "a", Error: "cancelled by alice"}}, acts.Alert.Steps)
}

func TestRetryRunsADownstreamFanOutAgainFromItsList(t *testing.T) {
	def := parse(t, `{"name":"two","steps":[
		{"name":"a","kind":"k","for_each":[0,1,2]},
		{"name":"b","kind":"k","depends_on":["a"],"for_each":"{{steps.a.succeeded}}","input":"{{item.index}}"}]}`)
	run, acts, err := Start(def, "t1", nil)
	require.NoError(t, err)
	round := 0
	f := newFleet(t, run, acts, func(j Job) Outcome {
		if j.Step == "a" && j.Element == 2 && round == 0 {
			return Outcome{Status: StatusFailed, Error: "x"}
		}
		return Outcome{Status: StatusSucceeded}
	})
	f.drain()
	require.Len(t, f.payloads["b"], 2, "b over a's two successes")
	assert.Equal(t, StatusFailed, f.run.Status)

	round = 1
	acts, err = f.run.RetryFailed()
	require.NoError(t, err)
	require.Len(t, acts.Publish, 1, "a's failed element only; b waits for a")
	assert.Equal(t, "a", acts.Publish[0].Step)
	f.apply(acts)
	f.drain()
	assert.Equal(t, StatusSucceeded, f.run.Status)
	require.Len(t, f.payloads["b"], 5, "b runs again over all three of a's elements")
	assert.JSONEq(t, "2", string(f.payloads["b"][4]))

	stale, err := f.run.JobEnded(protocol.WorkflowStepJobID("t1", "b", 7, 0), Outcome{Status: StatusFailed})
	require.NoError(t, err, "an element of an earlier list is ignored")
	assert.Empty(t, stale.Publish)
}

func TestNumbersPassThroughExactly(t *testing.T) {
	def := parse(t, `{"name":"n","steps":[{"name":"a","kind":"k","input":{"id":"{{input.id}}"}},
		{"name":"b","kind":"k","depends_on":["a"],"input":"{{steps.a.result.big}}"},
		{"name":"c","kind":"k","for_each":["{{input.id}}", 2],"input":"{{item}}"}]}`)
	run, acts, err := Start(def, "n1", json.RawMessage(`{"id":9007199254740993}`))
	require.NoError(t, err)
	require.Len(t, acts.Publish, 3)
	assert.JSONEq(t, `{"id":9007199254740993}`, string(acts.Publish[0].Payload))
	assert.JSONEq(t, `9007199254740993`, string(acts.Publish[1].Payload), "a literal list's templates are rendered")
	acts, err = run.JobEnded(acts.Publish[0].ID, Outcome{Status: StatusSucceeded, Result: json.RawMessage(`{"big":18014398509481985}`)})
	require.NoError(t, err)
	require.Len(t, acts.Publish, 1)
	assert.Equal(t, "18014398509481985", string(acts.Publish[0].Payload))
}

func TestLongNamesAreRefusedSoThatJobIDsFit(t *testing.T) {
	long := strings.Repeat("s", protocol.MaxWorkflowNameLength+1)
	_, err := protocol.ParseWorkflowDefinition([]byte(`{"name":"w","steps":[{"name":"` + long + `","kind":"k"}]}`))
	assert.ErrorContains(t, err, "at most 64 characters")
	_, _, err = Start(parse(t, nightly), long, nil)
	assert.ErrorContains(t, err, "invalid run id")
	longest := protocol.WorkflowStepJobID(strings.Repeat("r", 64), strings.Repeat("s", 64), 1<<31, 1<<31)
	require.NoError(t, protocol.ValidateJobID(longest))
}

func TestAStepWhoseInputCannotBeBuiltFailsWithTheReason(t *testing.T) {
	def := parse(t, `{"name":"bad","steps":[{"name":"fan","kind":"k","for_each":"{{input.files}}"}]}`)
	run, acts, err := Start(def, "b1", json.RawMessage(`{"files":"a.csv"}`))
	require.NoError(t, err)
	assert.Empty(t, acts.Publish)
	assert.True(t, acts.Ended)
	assert.Equal(t, StatusFailed, run.Status)
	require.NotNil(t, acts.Alert)
	assert.Equal(t, []StepFailure{{Step: "fan", Error: "for_each {{input.files}} is a string, not a list"}}, acts.Alert.Steps)

	_, _, err = Start(def, "b 2", nil)
	assert.ErrorContains(t, err, "invalid run id")
	_, _, err = Start(def, "b3", json.RawMessage(`{`))
	assert.EqualError(t, err, "run input: not a JSON value")
}

func TestCancelStopsWhatRuns(t *testing.T) {
	run, acts, err := Start(parse(t, nightly), "c1", nil)
	require.NoError(t, err)
	acts, err = run.JobEnded(acts.Publish[0].ID, Outcome{Status: StatusSucceeded, Result: files(20)})
	require.NoError(t, err)
	require.Len(t, acts.Publish, 10)
	acts, err = run.JobEnded(acts.Publish[0].ID, Outcome{Status: StatusSucceeded})
	require.NoError(t, err)
	require.Len(t, acts.Publish, 1, "the next element takes the free place")

	acts = run.Cancel()
	assert.True(t, acts.Ended)
	assert.Len(t, acts.Cancel, 10, "the ten elements running")
	assert.Equal(t, StatusCancelled, run.Status)
	for _, name := range []string{"export", "report", "page"} {
		assert.Equal(t, StatusCancelled, run.Steps[name].Status, name)
	}
	assert.Empty(t, run.Cancel().Cancel, "cancelling twice does nothing")
	late, err := run.JobEnded(protocol.WorkflowStepJobID("c1", "export", 5, 0), Outcome{Status: StatusSucceeded})
	require.NoError(t, err)
	assert.Empty(t, late.Publish, "an outcome after the cancel starts nothing")
}

func TestAnEmptyFanOutSucceedsAtOnce(t *testing.T) {
	run, acts, err := Start(parse(t, nightly), "e1", nil)
	require.NoError(t, err)
	acts, err = run.JobEnded(acts.Publish[0].ID, Outcome{Status: StatusSucceeded, Result: files(0)})
	require.NoError(t, err)
	require.Len(t, acts.Publish, 1)
	assert.Equal(t, "report", acts.Publish[0].Step)
	assert.JSONEq(t, `{"failed":[],"ok":[]}`, string(acts.Publish[0].Payload))
}

// drainBatches answers up to size jobs at once, in publishing order, with
// JobsEnded: what the supervisor does with a batch of events.
func (f *fleet) drainBatches(size int) {
	for len(f.queue) > 0 {
		n := min(size, len(f.queue))
		batch := f.queue[:n]
		f.queue = f.queue[n:]
		var outs []JobOutcome
		for _, j := range batch {
			f.running[j.Step]--
			if !contains(f.cancelled, j.ID) {
				outs = append(outs, JobOutcome{JobID: j.ID, Outcome: f.outcome(j)})
			}
		}
		f.reload()
		acts, _, errs := f.run.JobsEnded(outs)
		require.Empty(f.t, errs)
		f.apply(acts)
	}
}

// A batch of outcomes comes to what the same outcomes one by one do: the
// same end, failures, alert and fan-in input, each job published once and
// the parallelism kept.
func TestJobsEndedInBatchesEqualsOneByOne(t *testing.T) {
	def := parse(t, nightly)
	one, acts, err := Start(def, "r1", nil)
	require.NoError(t, err)
	byOne := newFleet(t, one, acts, alwaysFailing(0))
	byOne.drain()
	for _, size := range []int{1, 7, 64} {
		run, acts, err := Start(def, "r1", nil)
		require.NoError(t, err)
		batched := newFleet(t, run, acts, alwaysFailing(0))
		batched.drainBatches(size)
		assert.Equal(t, byOne.run.Status, batched.run.Status, "batch %d", size)
		assert.Equal(t, byOne.run.Failures(), batched.run.Failures(), "batch %d", size)
		assert.Equal(t, byOne.alerts, batched.alerts, "batch %d: one alert, the same", size)
		assert.Equal(t, byOne.payloads["report"], batched.payloads["report"], "batch %d: the fan-in's input", size)
		for id, n := range batched.published {
			assert.Equal(t, 1, n, "batch %d: %s published once", size, id)
		}
		assert.LessOrEqual(t, batched.maxRun["export"], 10, "batch %d: parallelism", size)
	}
	_, changed, errs := byOne.run.JobsEnded([]JobOutcome{{JobID: "wf:r1:export:3", Outcome: Outcome{Status: StatusSucceeded}},
		{JobID: "wf:other:x", Outcome: Outcome{Status: StatusSucceeded}}})
	assert.False(t, changed, "an outcome of an ended run changes nothing")
	assert.Len(t, errs, 1, "a job of another run is named")
}

// A leader that published the next jobs and died before storing the run
// leaves their outcomes in the same batch as the events that started them:
// the next leader, deciding from the older state, applies them too.
func TestJobsEndedAppliesOutcomesOfJobsItsBatchStarts(t *testing.T) {
	def := parse(t, `{"name":"wf","steps":[
	  {"name":"each","kind":"k","for_each":[0,1,2,3,4,5],"parallelism":2},
	  {"name":"sum","kind":"k","depends_on":["each"]}]}`)
	ok := Outcome{Status: StatusSucceeded}
	el := func(i int) JobOutcome {
		return JobOutcome{JobID: protocol.WorkflowStepJobID("r", "each", i, 0), Outcome: ok}
	}
	run, acts, err := Start(def, "r", nil)
	require.NoError(t, err)
	require.Len(t, acts.Publish, 2)

	acts, changed, errs := run.JobsEnded([]JobOutcome{el(0), el(1), el(2), el(3)})
	require.Empty(t, errs)
	assert.True(t, changed)
	assert.Equal(t, map[Status]int{StatusSucceeded: 4, StatusRunning: 2}, elementStatuses(run.Steps["each"]))
	require.Len(t, acts.Publish, 4, "2 and 3 again (deduplicated by their ids), then 4 and 5")

	sum := JobOutcome{JobID: protocol.WorkflowStepJobID("r", "sum", -1, 0), Outcome: ok}
	acts, _, errs = run.JobsEnded([]JobOutcome{el(4), el(5), sum})
	require.Empty(t, errs)
	assert.Equal(t, StatusSucceeded, run.Status, "the fan-in's outcome in the batch that started it")
	assert.True(t, acts.Ended)
}

func elementStatuses(st *StepState) map[Status]int {
	out := map[Status]int{}
	for _, el := range st.Elements {
		out[el.Status]++
	}
	return out
}

// BenchmarkFanOutOverAListedResult starts a fan-out over 10,000 files a
// listing step returned, and every one of its jobs: the scope (which holds
// the listing's result) is prepared once per transition, not per element.
func BenchmarkFanOutOverAListedResult(b *testing.B) {
	def, err := protocol.ParseWorkflowDefinition([]byte(strings.Replace(nightly, `"parallelism":10,`, "", 1)))
	require.NoError(b, err)
	list := files(10_000)
	for b.Loop() {
		run, acts, err := Start(*def, "r1", nil)
		require.NoError(b, err)
		require.Len(b, acts.Publish, 1)
		acts, err = run.JobEnded(acts.Publish[0].ID, Outcome{Status: StatusSucceeded, Result: list})
		require.NoError(b, err)
		require.Len(b, acts.Publish, 10_000)
		require.Len(b, run.RunningJobs(), 10_000)
	}
}
