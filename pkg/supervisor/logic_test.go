package supervisor

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor/workflow"
)

func TestRateWindowSlides(t *testing.T) {
	t.Parallel()
	w := newRateWindow(time.Minute) // 1s buckets
	t0 := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	w.add(t0, true)
	w.add(t0.Add(500*time.Millisecond), false)
	w.add(t0.Add(30*time.Second), true)
	fail, seen := w.sums(t0.Add(30 * time.Second))
	assert.Equal(t, 2, fail)
	assert.Equal(t, 3, seen)
	fail, seen = w.sums(t0.Add(75 * time.Second)) // the first second left the window
	assert.Equal(t, 1, fail)
	assert.Equal(t, 1, seen)
	w.add(t0.Add(2*time.Minute+30*time.Second), false) // reuses the bucket of t0+30s
	fail, seen = w.sums(t0.Add(2*time.Minute + 30*time.Second))
	assert.Equal(t, 0, fail)
	assert.Equal(t, 1, seen)
	w.clear()
	_, seen = w.sums(t0.Add(2*time.Minute + 30*time.Second))
	assert.Zero(t, seen)
}

func TestStatsOf(t *testing.T) {
	t.Parallel()
	rec := func(status string, d time.Duration) *jetfleetpb.Execution {
		return &jetfleetpb.Execution{Status: status, Duration: durationpb.New(d)}
	}
	// Newest first.
	recs := []*jetfleetpb.Execution{
		rec(protocol.EventDead, 5*time.Millisecond), rec(protocol.EventDead, 1*time.Millisecond),
		rec(protocol.EventSucceeded, 10*time.Millisecond), rec(protocol.EventSucceeded, 20*time.Millisecond),
		rec(protocol.EventDead, 30*time.Millisecond),
	}
	st := statsOf(recs)
	assert.Equal(t, jetfleet.HistoryStats{Executions: 5, Succeeded: 2, Dead: 3, SuccessRate: 0.4, P50: 10 * time.Millisecond,
		P95: 30 * time.Millisecond, ConsecutiveFailures: 2}, st)
	assert.Equal(t, jetfleet.HistoryStats{}, statsOf(nil))
	for _, tc := range []struct {
		n    int
		p    float64
		want time.Duration
	}{{1, 0.5, 1}, {2, 0.5, 1}, {3, 0.5, 2}, {100, 0.95, 95}, {100, 0.5, 50}, {20, 0.95, 19}} {
		sorted := make([]time.Duration, tc.n)
		for i := range sorted {
			sorted[i] = time.Duration(i + 1)
		}
		assert.Equal(t, tc.want, percentile(sorted, tc.p), "p%.0f of 1..%d", 100*tc.p, tc.n)
	}
}

func TestPolicyResolution(t *testing.T) {
	t.Parallel()
	cfg := Config{Escalation: EscalationConfig{
		Default:   EscalationPolicy{PauseScheduleAfter: 5},
		Kinds:     map[string]EscalationPolicy{"mail": {Alert: protocol.SeverityWarning, CompensateKind: "undo-mail"}},
		Schedules: map[string]EscalationPolicy{"nightly": {PauseScheduleAfter: 2, Alert: SeverityNone}},
	}, Breaker: BreakerConfig{Default: BreakerPolicy{FailureRate: 0.5}, Queues: map[string]BreakerPolicy{"pay": {CoolDown: time.Hour}}}}
	cfg = cfg.withDefaults(5 * time.Second)
	assert.Equal(t, EscalationPolicy{Alert: protocol.SeverityCritical, PauseScheduleAfter: 5, TimeoutAction: TimeoutActionNak},
		cfg.policyFor("sms", ""))
	assert.Equal(t, EscalationPolicy{Alert: protocol.SeverityWarning, CompensateKind: "undo-mail", PauseScheduleAfter: 5,
		TimeoutAction: TimeoutActionNak}, cfg.policyFor("mail", "other"))
	assert.Equal(t, EscalationPolicy{Alert: SeverityNone, CompensateKind: "undo-mail", PauseScheduleAfter: 2,
		TimeoutAction: TimeoutActionNak}, cfg.policyFor("mail", "nightly"))
	assert.Equal(t, BreakerPolicy{FailureRate: 0.5, Window: time.Minute, MinSamples: 20, CoolDown: time.Hour}, cfg.breakerFor("pay"))
	assert.Equal(t, BreakerPolicy{FailureRate: 0.5, Window: time.Minute, MinSamples: 20, CoolDown: time.Minute}, cfg.breakerFor("default"))
}

func TestAlerterForgetsIncidentsPastTheWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	a := &alerter{last: map[string]time.Time{"agent_dead:a-1": t0, "agent_dead:a-2": t0.Add(10 * time.Minute)}}
	a.pruneLocked(t0.Add(9*time.Minute), 10*time.Minute)
	assert.Len(t, a.last, 2, "both inside the window")
	a.pruneLocked(t0.Add(11*time.Minute), 10*time.Minute)
	assert.Len(t, a.last, 2, "pruned at most once per window")
	a.pruneLocked(t0.Add(19*time.Minute), 10*time.Minute)
	assert.Equal(t, map[string]time.Time{"agent_dead:a-2": t0.Add(10 * time.Minute)}, a.last)
}

// TestAStepResultAboveTheProtocolLimitFailsTheStep: a foreign agent's
// success whose result is above the protocol's limit fails the step with
// the reason; one at the limit succeeds; other events are not outcomes.
func TestAStepResultAboveTheProtocolLimitFailsTheStep(t *testing.T) {
	atLimit := []byte(`"` + strings.Repeat("x", protocol.MaxResult-2) + `"`)
	out, ok := stepOutcome(&jetfleetpb.JobEvent{Type: protocol.EventSucceeded, Result: atLimit})
	require.True(t, ok)
	assert.Equal(t, workflow.StatusSucceeded, out.Status)
	assert.Len(t, out.Result, protocol.MaxResult)

	over := append([]byte(`"x`), atLimit[1:]...)
	out, ok = stepOutcome(&jetfleetpb.JobEvent{Type: protocol.EventSucceeded, Result: over, AgentId: "py-7"})
	require.True(t, ok)
	assert.Equal(t, workflow.StatusFailed, out.Status)
	assert.Nil(t, out.Result)
	assert.Equal(t, fmt.Sprintf("result too large: %d bytes, the protocol's limit is %d (agent py-7)", protocol.MaxResult+1, protocol.MaxResult), out.Error)

	out, ok = stepOutcome(&jetfleetpb.JobEvent{Type: protocol.EventDead, Reason: "max_attempts", Error: "boom\nstack"})
	require.True(t, ok)
	assert.Equal(t, workflow.Outcome{Status: workflow.StatusFailed, Error: "max_attempts: boom"}, out)

	_, ok = stepOutcome(&jetfleetpb.JobEvent{Type: protocol.EventRetrying})
	assert.False(t, ok, "not terminal")
}
