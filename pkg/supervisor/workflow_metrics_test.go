package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestWorkflowMetricsCountRunsAndFailedElements: the runs-by-outcome counter
// (jetfleet.supervisor.workflow_runs) counts each run's start and its end
// under the outcome it ended with, and a start message that cannot start a
// run as refused; the failures counter (jetfleet.supervisor.workflow_failures)
// counts exactly the fan-out elements that failed, under their step — not
// the ones that succeeded, not the fan-in that ran after them.
func TestWorkflowMetricsCountRunsAndFailedElements(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	ctx := fleettest.Ctx(t, time.Minute)
	sup, _ := f.leader(t, fast(supervisor.Config{}), nil)
	f.startAgent(t, "", agent.Config{Concurrency: 4}, func(a *agent.Agent) {
		must(t, a.Register("element", func(_ context.Context, job *agent.Job) error {
			var in struct {
				N int `json:"n"`
			}
			if err := json.Unmarshal(job.Payload, &in); err != nil {
				return agent.NonRetryable(err)
			}
			if in.N < 0 {
				return agent.NonRetryable(errors.New("negative element"))
			}
			return nil
		}, agent.KindOptions{}))
		must(t, a.Register("report", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})
	_, err := f.client.AddWorkflow(ctx, &protocol.WorkflowDefinition{Name: "metered", Steps: []protocol.WorkflowStep{
		{Name: "each", Kind: "element", ForEach: json.RawMessage(`"{{input}}"`), Input: json.RawMessage(`{"n":"{{item}}"}`),
			OnElementFailure: protocol.ElementFailureContinue},
		{Name: "report", Kind: "report", DependsOn: []string{"each"}, When: protocol.WhenAlways,
			Input: json.RawMessage(`{"failed":"{{steps.each.failed}}"}`)},
	}})
	require.NoError(t, err)

	// Three of six elements fail: the run ends failed with exactly those.
	_, err = f.client.RunWorkflow(ctx, "metered", []int{1, -2, 3, -4, -5, 6}, jetfleet.RunID("some-fail"))
	require.NoError(t, err)
	run, err := f.client.WaitWorkflowRun(ctx, "some-fail")
	require.NoError(t, err)
	require.Equal(t, jetfleet.WorkflowFailed, run.Status)
	require.Len(t, run.Failures.Elements, 3)
	require.Empty(t, run.Failures.Steps)

	// Every element succeeds: the run ends succeeded, nothing failed.
	_, err = f.client.RunWorkflow(ctx, "metered", []int{7, 8}, jetfleet.RunID("all-ok"))
	require.NoError(t, err)
	run, err = f.client.WaitWorkflowRun(ctx, "all-ok")
	require.NoError(t, err)
	require.Equal(t, jetfleet.WorkflowSucceeded, run.Status)

	// A start message naming no stored workflow is refused.
	msg := nats.NewMsg(protocol.WorkflowStartSubject("unknown"))
	msg.Header.Set(protocol.HeaderRunID, "refused-1")
	_, err = f.js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	run, err = f.client.WaitWorkflowRun(ctx, "refused-1")
	require.NoError(t, err)
	require.Equal(t, jetfleet.WorkflowFailed, run.Status)
	require.NotEmpty(t, run.Error)

	// Counted just after each run is stored, which the client may see first.
	wantRuns := map[string]float64{
		"workflow=metered event=started":   2,
		"workflow=metered event=failed":    1,
		"workflow=metered event=succeeded": 1,
		"workflow=unknown event=refused":   1,
	}
	wantFailures := map[string]float64{"workflow=metered step=each": 3}
	waitFor(t, 5*time.Second, "both runs' ends and the refused start counted", func() bool {
		return assert.ObjectsAreEqual(wantRuns, counterSeries(t, sup, "jetfleet_supervisor_workflow_runs_total", "workflow", "event")) &&
			assert.ObjectsAreEqual(wantFailures, counterSeries(t, sup, "jetfleet_supervisor_workflow_failures_total", "workflow", "step"))
	})
	assert.Equal(t, wantRuns, counterSeries(t, sup, "jetfleet_supervisor_workflow_runs_total", "workflow", "event"))
	assert.Equal(t, wantFailures, counterSeries(t, sup, "jetfleet_supervisor_workflow_failures_total", "workflow", "step"),
		"exactly the failed elements, under their step")
}

// counterSeries is each series of the supervisor's counter name, keyed by
// the values of labels ("workflow=w event=failed"); empty while nothing was
// counted.
func counterSeries(t *testing.T, s *supervisor.Supervisor, name string, labels ...string) map[string]float64 {
	t.Helper()
	families, err := s.Registry().Gather()
	require.NoError(t, err)
	series := map[string]float64{}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			values := map[string]string{}
			for _, lp := range m.GetLabel() {
				values[lp.GetName()] = lp.GetValue()
			}
			key := make([]string, 0, len(labels))
			for _, l := range labels {
				key = append(key, l+"="+values[l])
			}
			series[strings.Join(key, " ")] += m.GetCounter().GetValue()
		}
	}
	return series
}
