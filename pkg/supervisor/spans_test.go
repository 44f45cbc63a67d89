package supervisor_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// TestSupervisorSpansJoinTheJobsTrace: the supervisor's dead letter,
// escalation and replay of a job are spans of the job's own trace, and the
// replayed job carries the replay span as its parent.
func TestSupervisorSpansJoinTheJobsTrace(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	env := fleettest.NewEnv(t, f.srv, f.topo)
	s, err := supervisor.New(supervisor.Config{UnroutableAfter: 100 * time.Millisecond}, env.Env, nil)
	require.NoError(t, err)
	require.NoError(t, s.Start(fleettest.Ctx(t, 30*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Stop(ctx)
	})
	require.NoError(t, s.WaitLeading(fleettest.Ctx(t, 20*time.Second), true))

	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	const parent = "00f067aa0ba902b7"
	msg := nats.NewMsg("jobs.nowhere.echo")
	msg.Header.Set(protocol.HeaderJobID, "traced-1")
	msg.Header.Set("traceparent", "00-"+traceID.String()+"-"+parent+"-01")
	_, err = f.js.PublishMsg(fleettest.Ctx(t, 5*time.Second), msg)
	require.NoError(t, err)
	f.events.WaitFor(t, 20*time.Second, "traced-1", protocol.EventDead) // unroutable: no queue nowhere

	names := func() map[string]bool {
		out := map[string]bool{}
		for _, sp := range env.Spans.GetSpans() {
			if sp.SpanContext.TraceID() == traceID {
				out[sp.Name] = true
				if sp.Name == "supervisor.dead_letter" {
					assert.Equal(t, parent, sp.Parent.SpanID().String())
				}
			}
		}
		return out
	}
	require.Eventually(t, func() bool { n := names(); return n["supervisor.dead_letter"] && n["supervisor.escalate"] },
		10*time.Second, 20*time.Millisecond, "dead letter and escalation spans in the job's trace")

	ctx := fleettest.Ctx(t, 10*time.Second)
	_, err = f.client.AddQueue(ctx, jetfleet.QueueAddRequest{Queue: "nowhere"})
	require.NoError(t, err)
	letters, err := f.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{})
	require.NoError(t, err)
	require.Len(t, letters.Letters, 1)
	res, err := f.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{Sequence: letters.Letters[0].Sequence})
	require.NoError(t, err)
	require.True(t, names()["supervisor.replay"], "replay span in the job's trace")
	jobs, err := f.js.Stream(ctx, protocol.StreamJobs)
	require.NoError(t, err)
	replayed, err := jobs.GetMsg(ctx, res.Results[0].JobSequence)
	require.NoError(t, err)
	tp := replayed.Header.Get("traceparent")
	assert.Contains(t, tp, traceID.String(), "the replayed job continues the trace")
	assert.NotContains(t, tp, parent, "under the replay span")
}
