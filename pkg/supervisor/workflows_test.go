package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/supervisor/workflow"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestWorkflowRunSurvivesLeaderCrashes kills the supervisor leader three
// times (its connection cut, as kill -9 would, without resigning) while a
// run fans out 200 elements: a new leader takes over each time from the
// stored run and its unacked events, and in the end every element and the
// fan-in ran exactly once, none forgotten.
func TestWorkflowRunSurvivesLeaderCrashes(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{LeaseTTL: 2 * time.Second})
	cfg := fast(supervisor.Config{})
	ctx := fleettest.Ctx(t, 3*time.Minute)

	var mu sync.Mutex
	runs := map[string]int{}
	var fanIn []json.RawMessage
	f.startAgent(t, "", agent.Config{Concurrency: 8}, func(a *agent.Agent) {
		must(t, a.Register("element", func(ctx context.Context, job *agent.Job) error {
			mu.Lock()
			runs[job.ID]++
			mu.Unlock()
			time.Sleep(20 * time.Millisecond) // the work itself
			return agent.RecordResult(ctx, map[string]any{"done": job.ID})
		}, agent.KindOptions{}))
		must(t, a.Register("sum", func(_ context.Context, job *agent.Job) error {
			mu.Lock()
			defer mu.Unlock()
			runs[job.ID]++
			fanIn = append(fanIn, job.Payload)
			return nil
		}, agent.KindOptions{}))
	})

	type replica struct {
		s    *supervisor.Supervisor
		kill func()
	}
	start := func() replica {
		env := fleettest.NewEnvURL(t, f.srv.ClientURL(), f.topo)
		env.Logger = f.logs.Wrap(env.Logger)
		s, err := supervisor.New(cfg, env.Env, clock.Real())
		require.NoError(t, err)
		require.NoError(t, s.Start(ctx))
		t.Cleanup(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = s.Stop(sctx) // a killed replica's fails on its closed connection
		})
		return replica{s: s, kill: env.Conn.Close}
	}
	replicas := []replica{start(), start()}
	leader := func() replica {
		var found replica
		waitFor(t, 20*time.Second, "a supervisor leader", func() bool {
			for _, r := range replicas {
				if r.s.IsLeader() {
					found = r
					return true
				}
			}
			return false
		})
		return found
	}
	leader()

	items := make([]int, 200)
	for i := range items {
		items[i] = i
	}
	list, err := json.Marshal(items)
	require.NoError(t, err)
	def := &protocol.WorkflowDefinition{Name: "crashy", Steps: []protocol.WorkflowStep{
		{Name: "each", Kind: "element", ForEach: list, Parallelism: 16, Input: json.RawMessage(`{"n":"{{item}}"}`)},
		{Name: "sum", Kind: "sum", DependsOn: []string{"each"}, Input: json.RawMessage(`{"ok":"{{steps.each.succeeded}}"}`)},
	}}
	_, err = f.client.AddWorkflow(ctx, def)
	require.NoError(t, err)
	started, err := f.client.RunWorkflow(ctx, "crashy", nil, jetfleet.RunID("crash-1"))
	require.NoError(t, err)
	require.Equal(t, "crash-1", started.RunID, "%+v", started)

	succeeded := func() int {
		n := 0
		for _, ev := range f.events.All() {
			if ev.GetType() == protocol.EventSucceeded && strings.HasPrefix(ev.GetJobId(), "wf:crash-1:each:") {
				n++
			}
		}
		return n
	}
	for i, after := range []int{30, 80, 130} {
		waitFor(t, 60*time.Second, fmt.Sprintf("%d elements succeeded", after), func() bool { return succeeded() >= after })
		doomed := leader()
		doomed.kill()
		kept := replicas[:0]
		for _, r := range replicas {
			if r.s != doomed.s {
				kept = append(kept, r)
			}
		}
		replicas = append(kept, start())
		t.Logf("kill %d: the leader died after %d elements", i+1, succeeded())
	}

	run, err := f.client.WaitWorkflowRun(ctx, started.RunID)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowSucceeded, run.Status, "%+v", run.Failures)
	mu.Lock()
	defer mu.Unlock()
	for i := range items {
		id := protocol.WorkflowStepJobID("crash-1", "each", i, 0)
		assert.Equal(t, 1, runs[id], "element %d ran once", i)
	}
	assert.Equal(t, 1, runs[protocol.WorkflowStepJobID("crash-1", "sum", -1, 0)], "the fan-in ran once")
	require.Len(t, fanIn, 1)
	var in struct {
		OK []struct {
			Index int `json:"index"`
		} `json:"ok"`
	}
	require.NoError(t, json.Unmarshal(fanIn[0], &in))
	assert.Len(t, in.OK, 200, "the fan-in sees every element")
}

// TestWorkflowRunIsOneTrace: a run started by a message with a trace
// context is one trace: its root span is the message's child, every step's
// job carries the root as its traceparent, and workflow.end closes it.
func TestWorkflowRunIsOneTrace(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	env := fleettest.NewEnv(t, f.srv, f.topo)
	s, err := supervisor.New(fast(supervisor.Config{}), env.Env, nil)
	require.NoError(t, err)
	ctx := fleettest.Ctx(t, time.Minute)
	require.NoError(t, s.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Stop(sctx)
	})
	require.NoError(t, s.WaitLeading(ctx, true))
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("step", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})
	_, err = f.client.AddWorkflow(ctx, &protocol.WorkflowDefinition{Name: "traced", Steps: []protocol.WorkflowStep{
		{Name: "a", Kind: "step"}, {Name: "b", Kind: "step", DependsOn: []string{"a"}, ForEach: json.RawMessage(`[1,2]`)}}})
	require.NoError(t, err)

	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	const parent = "00f067aa0ba902b7"
	msg := nats.NewMsg(protocol.WorkflowStartSubject("traced"))
	msg.Header.Set(protocol.HeaderRunID, "traced-1")
	msg.Header.Set("traceparent", "00-"+traceID.String()+"-"+parent+"-01")
	_, err = f.js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	run, err := f.client.WaitWorkflowRun(ctx, "traced-1")
	require.NoError(t, err)
	require.Equal(t, jetfleet.WorkflowSucceeded, run.Status)

	var root trace.SpanID
	ends := 0
	for _, sp := range env.Spans.GetSpans() {
		switch sp.Name {
		case "workflow.run traced":
			assert.Equal(t, traceID, sp.SpanContext.TraceID())
			assert.Equal(t, parent, sp.Parent.SpanID().String(), "the start message's child")
			root = sp.SpanContext.SpanID()
		case "workflow.end traced":
			ends++
			assert.Equal(t, traceID, sp.SpanContext.TraceID())
		}
	}
	require.True(t, root.IsValid(), "the run's root span was recorded")
	assert.Equal(t, 1, ends)
	for _, id := range []string{"wf:traced-1:a", "wf:traced-1:b:0", "wf:traced-1:b:1"} {
		ev := f.events.WaitFor(t, 10*time.Second, id, protocol.EventSucceeded)
		assert.Equal(t, traceID.String(), ev.GetTraceId(), "job %s is in the run's trace", id)
	}
}

// A → (B, C) → D: D receives B's and C's results. A result over the
// agent's max_result fails its step, the reason named, and the run with it.
func TestWorkflowDAGPassesResults(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, time.Minute)
	sup, _ := f.leader(t, fast(supervisor.Config{}), nil)
	payloads := make(chan json.RawMessage, 4)
	f.startAgent(t, "", agent.Config{MaxResult: 1024}, func(a *agent.Agent) {
		must(t, a.Register("a", func(ctx context.Context, _ *agent.Job) error {
			return agent.RecordResult(ctx, map[string]int{"seed": 7})
		}, agent.KindOptions{}))
		must(t, a.Register("b", func(ctx context.Context, _ *agent.Job) error {
			return agent.RecordResult(ctx, map[string]any{"rows": 42, "from": "b"})
		}, agent.KindOptions{}))
		must(t, a.Register("c", func(ctx context.Context, _ *agent.Job) error {
			return agent.RecordResult(ctx, []string{"x", "y"})
		}, agent.KindOptions{}))
		must(t, a.Register("d", func(_ context.Context, job *agent.Job) error {
			payloads <- job.Payload
			return nil
		}, agent.KindOptions{}))
		must(t, a.Register("huge", func(ctx context.Context, _ *agent.Job) error {
			return agent.NonRetryable(agent.RecordResult(ctx, strings.Repeat("x", 2048)))
		}, agent.KindOptions{}))
	})
	_, err := f.client.AddWorkflow(ctx, &protocol.WorkflowDefinition{Name: "diamond", Steps: []protocol.WorkflowStep{
		{Name: "a", Kind: "a"},
		{Name: "b", Kind: "b", DependsOn: []string{"a"}, Input: json.RawMessage(`{"seed":"{{steps.a.result.seed}}"}`)},
		{Name: "c", Kind: "c", DependsOn: []string{"a"}},
		{Name: "d", Kind: "d", DependsOn: []string{"b", "c"},
			Input: json.RawMessage(`{"b":"{{steps.b.result}}","c":"{{steps.c.result}}","rows":"{{steps.b.result.rows}}"}`)},
	}})
	require.NoError(t, err)
	events := subscribe(t, f.nc, protocol.WorkflowEventsSubjects)
	started, err := f.client.RunWorkflow(ctx, "diamond", nil)
	require.NoError(t, err)
	run, err := f.client.WaitWorkflowRun(ctx, started.RunID)
	require.NoError(t, err)
	require.Equal(t, jetfleet.WorkflowSucceeded, run.Status)
	var seen []string
	for len(seen) < 10 {
		m := events.next(t, 10*time.Second)
		var ev protocol.WorkflowEvent
		require.NoError(t, json.Unmarshal(m.Data, &ev))
		assert.Equal(t, protocol.WorkflowEventSubject("diamond", ev.Type, started.RunID), m.Subject)
		seen = append(seen, strings.TrimSpace(ev.Type+" "+ev.Step))
	}
	assert.ElementsMatch(t, []string{"run_started", "step_started a", "step_succeeded a", "step_started b", "step_started c",
		"step_succeeded b", "step_succeeded c", "step_started d", "step_succeeded d", "run_succeeded"}, seen,
		"the run's and each step's start and end")
	select {
	case p := <-payloads:
		assert.JSONEq(t, `{"b":{"rows":42,"from":"b"},"c":["x","y"],"rows":42}`, string(p))
	default:
		t.Fatal("d did not run")
	}
	for _, st := range run.Steps {
		require.NotNil(t, st.StartedAt, "step %s", st.Name)
		require.NotNil(t, st.EndedAt, "step %s", st.Name)
		assert.False(t, st.EndedAt.Before(*st.StartedAt), "step %s", st.Name)
	}
	// Recorded just after the run is stored, which the client may see first.
	waitFor(t, 5*time.Second, "one duration per step", func() bool {
		return histogramCount(t, sup, "jetfleet_supervisor_workflow_step_duration_seconds") == 4
	})

	_, err = f.client.AddWorkflow(ctx, &protocol.WorkflowDefinition{Name: "too-big", Steps: []protocol.WorkflowStep{
		{Name: "big", Kind: "huge"}, {Name: "after", Kind: "d", DependsOn: []string{"big"}}}})
	require.NoError(t, err)
	started, err = f.client.RunWorkflow(ctx, "too-big", nil)
	require.NoError(t, err)
	run, err = f.client.WaitWorkflowRun(ctx, started.RunID)
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowFailed, run.Status)
	require.Len(t, run.Failures.Steps, 1)
	assert.Equal(t, "big", run.Failures.Steps[0].Step)
	assert.Contains(t, run.Failures.Steps[0].Error, "agent.max_result")
	assert.Equal(t, jetfleet.WorkflowSkipped, run.Steps[1].Status, "what depends on it does not run")
	assert.Empty(t, payloads)
}

// TestWorkflowStartLeftUnderWayIsFinished: a leader that died after
// writing a start's intent (and perhaps publishing its first jobs) but
// before creating the run leaves the intent; the next leader finishes the
// start — the first jobs published once, the run stored — and it runs to
// its end.
func TestWorkflowStartLeftUnderWayIsFinished(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, time.Minute)
	def := protocol.WorkflowDefinition{Name: "interrupted", Steps: []protocol.WorkflowStep{
		{Name: "each", Kind: "step", ForEach: json.RawMessage(`[1,2,3]`)}, {Name: "after", Kind: "step", DependsOn: []string{"each"}}}}
	run, acts, err := workflow.Start(def, "left-1", nil)
	require.NoError(t, err)
	require.Len(t, acts.Publish, 3)
	run.StartedAt, run.UpdatedAt = time.Now().UTC(), time.Now().UTC()
	data, err := json.Marshal(run)
	require.NoError(t, err)
	runs, err := f.js.KeyValue(ctx, protocol.BucketWorkflowRuns)
	require.NoError(t, err)
	_, err = runs.Put(ctx, "starting.left-1", data) // what the dead leader left
	require.NoError(t, err)

	var mu sync.Mutex
	ran := map[string]int{}
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("step", func(_ context.Context, job *agent.Job) error {
			mu.Lock()
			defer mu.Unlock()
			ran[job.ID]++
			return nil
		}, agent.KindOptions{}))
	})
	_, _ = f.leader(t, fast(supervisor.Config{}), nil)
	done, err := f.client.WaitWorkflowRun(ctx, "left-1")
	require.NoError(t, err)
	assert.Equal(t, jetfleet.WorkflowSucceeded, done.Status)
	mu.Lock()
	assert.Equal(t, map[string]int{"wf:left-1:each:0": 1, "wf:left-1:each:1": 1, "wf:left-1:each:2": 1, "wf:left-1:after": 1}, ran)
	mu.Unlock()
	_, err = runs.Get(ctx, "starting.left-1")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the intent is gone once the run is stored")
	listed, err := f.client.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{})
	require.NoError(t, err)
	require.Len(t, listed, 1, "an intent is no run of its own")
}

// histogramCount is how many values the supervisor's histogram name holds,
// over all its series.
func histogramCount(t *testing.T, s *supervisor.Supervisor, name string) uint64 {
	t.Helper()
	families, err := s.Registry().Gather()
	require.NoError(t, err)
	var n uint64
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
		}
		return n
	}
	t.Fatalf("no histogram %s", name)
	return 0
}
