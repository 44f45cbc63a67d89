package supervisor

import (
	"context"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor/workflow"
)

// metrics are the supervisor's OpenTelemetry instruments (Prometheus names
// in docs/supervision.md).
type metrics struct {
	rescues     metric.Int64Counter
	deadLetters metric.Int64Counter
	timeouts    metric.Int64Counter
	alerts      metric.Int64Counter
	webhooks    metric.Int64Counter
	transitions metric.Int64Counter
	// Workflows: runs started and ended (by workflow and outcome) and
	// starts refused, step jobs published, failed steps and fan-out
	// elements of ended runs, and step durations.
	workflowRuns     metric.Int64Counter
	workflowJobs     metric.Int64Counter
	workflowFailures metric.Int64Counter
	workflowStepTime metric.Float64Histogram

	dlqDepth   atomic.Int64
	agentsLive atomic.Int64
	agentsDead atomic.Int64
	ackOverdue atomic.Int64
	leading    atomic.Int64

	mu       sync.Mutex
	breakers map[string]int64 // queue → 1 while open
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := &metrics{breakers: map[string]int64{}}
	meter := mp.Meter("github.com/jetfleet/jetfleet/pkg/supervisor")
	var err error
	if m.rescues, err = meter.Int64Counter("jetfleet.supervisor.rescues",
		metric.WithDescription("Jobs of dead agents released for immediate redelivery, by queue")); err != nil {
		return nil, err
	}
	if m.deadLetters, err = meter.Int64Counter("jetfleet.supervisor.dead_letters",
		metric.WithDescription("Dead letters stored in the DLQ stream, by queue and reason")); err != nil {
		return nil, err
	}
	if m.timeouts, err = meter.Int64Counter("jetfleet.supervisor.timeouts",
		metric.WithDescription("Attempts the supervisor failed because they ran past deadline and kill grace, by queue")); err != nil {
		return nil, err
	}
	if m.alerts, err = meter.Int64Counter("jetfleet.supervisor.alerts",
		metric.WithDescription("Alerts, by type, severity and outcome (sent or deduplicated)")); err != nil {
		return nil, err
	}
	if m.webhooks, err = meter.Int64Counter("jetfleet.supervisor.webhook_deliveries",
		metric.WithDescription("Webhook deliveries of alerts, by webhook and outcome (delivered, failed, retried)")); err != nil {
		return nil, err
	}
	if m.transitions, err = meter.Int64Counter("jetfleet.supervisor.breaker_transitions",
		metric.WithDescription("Circuit breaker transitions, by queue and event (breaker_opened, breaker_closed)")); err != nil {
		return nil, err
	}
	if m.workflowRuns, err = meter.Int64Counter("jetfleet.supervisor.workflow_runs",
		metric.WithDescription("Workflow runs started and ended, and start messages refused, by workflow and event (started, succeeded, failed, cancelled, refused)")); err != nil {
		return nil, err
	}
	if m.workflowJobs, err = meter.Int64Counter("jetfleet.supervisor.workflow_jobs",
		metric.WithDescription("Jobs published for workflow steps, by workflow and step")); err != nil {
		return nil, err
	}
	if m.workflowStepTime, err = meter.Float64Histogram("jetfleet.supervisor.workflow_step_duration",
		metric.WithDescription("Time from a workflow step's start to its end (all of a fan-out's elements), by workflow, step and status"),
		metric.WithUnit("s")); err != nil {
		return nil, err
	}
	if m.workflowFailures, err = meter.Int64Counter("jetfleet.supervisor.workflow_failures",
		metric.WithDescription("Failed steps and fan-out elements of ended workflow runs, by workflow and step")); err != nil {
		return nil, err
	}
	gauge := func(name, desc string, v *atomic.Int64) error {
		_, err := meter.Int64ObservableGauge(name, metric.WithDescription(desc),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				o.Observe(v.Load())
				return nil
			}))
		return err
	}
	for _, g := range []struct {
		name, desc string
		v          *atomic.Int64
	}{
		{"jetfleet.supervisor.dlq_depth", "Dead letters in the DLQ stream", &m.dlqDepth},
		{"jetfleet.supervisor.agents_alive", "Agents sending heartbeats", &m.agentsLive},
		{"jetfleet.supervisor.agents_dead", "Agents declared dead and still listed", &m.agentsDead},
		{"jetfleet.supervisor.ack_overdue", "Jobs a live agent still runs although JetStream redelivered them", &m.ackOverdue},
		{"jetfleet.supervisor.leader", "1 while this replica is the supervisor leader", &m.leading},
	} {
		if err := gauge(g.name, g.desc, g.v); err != nil {
			return nil, err
		}
	}
	if _, err = meter.Int64ObservableGauge("jetfleet.supervisor.breaker_open",
		metric.WithDescription("1 while the queue's circuit breaker holds its consumer paused, by queue"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			m.mu.Lock()
			defer m.mu.Unlock()
			for q, v := range m.breakers {
				o.Observe(v, metric.WithAttributes(attribute.String("queue", q)))
			}
			return nil
		})); err != nil {
		return nil, err
	}
	return m, nil
}

// workflowTransition counts a stored transition of a run, whose workflow
// events were evs.
func (m *metrics) workflowTransition(ctx context.Context, run *workflow.Run, acts workflow.Actions, evs []protocol.WorkflowEvent) {
	if run.Round == 0 && run.StartedAt.Equal(run.UpdatedAt) {
		m.workflowRuns.Add(ctx, 1, attrs("workflow", run.Workflow, "event", "started"))
	}
	for _, ev := range evs {
		st := run.Steps[ev.Step]
		if st == nil || st.StartedAt == nil || st.EndedAt == nil || !protocol.IsWorkflowStepEnd(ev.Type) {
			continue
		}
		m.workflowStepTime.Record(ctx, st.EndedAt.Sub(*st.StartedAt).Seconds(),
			attrs("workflow", run.Workflow, "step", ev.Step, "status", string(st.Status)))
	}
	for _, j := range acts.Publish {
		m.workflowJobs.Add(ctx, 1, attrs("workflow", run.Workflow, "step", j.Step))
	}
	if !acts.Ended {
		return
	}
	m.workflowRuns.Add(ctx, 1, attrs("workflow", run.Workflow, "event", string(run.Status)))
	f := run.Failures()
	for _, sf := range f.Steps {
		m.workflowFailures.Add(ctx, 1, attrs("workflow", run.Workflow, "step", sf.Step))
	}
	for _, ef := range f.Elements {
		m.workflowFailures.Add(ctx, 1, attrs("workflow", run.Workflow, "step", ef.Step))
	}
}

func (m *metrics) setBreaker(queue string, open bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v := int64(0)
	if open {
		v = 1
	}
	m.breakers[queue] = v
}

func attrs(kv ...string) metric.MeasurementOption {
	a := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		a = append(a, attribute.String(kv[i], kv[i+1]))
	}
	return metric.WithAttributes(a...)
}
