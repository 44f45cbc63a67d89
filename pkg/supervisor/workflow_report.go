package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor/workflow"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// What a workflow run tells the world: its trace, its alert, and the job
// events of the job it stands for.

// traceParentHeader is the W3C trace context header.
const traceParentHeader = "traceparent"

// traceStart records the run's root span, workflow.run <workflow>, as a
// child of the start message's trace context when it has one (a schedule's
// fire), and returns its context for the steps' jobs: their attempts are
// its children, so Jaeger shows a run as one trace. The span itself ends at
// once (a run outlives any one leader); workflow.end marks the end.
func (w *workflows) traceStart(ctx context.Context, run *workflow.Run, parent nats.Header) string {
	if parent != nil {
		ctx = telemetry.Extract(ctx, parent)
	}
	ctx, span := w.s.tracer().Start(ctx, "workflow.run "+run.Workflow, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("jetfleet.workflow", run.Workflow), attribute.String("jetfleet.workflow_run", run.ID),
			attribute.Int("jetfleet.workflow_steps", len(run.Def.Steps))))
	defer span.End()
	h := nats.Header{}
	telemetry.Inject(ctx, h)
	return h.Get(traceParentHeader)
}

// traceEnd records workflow.end <workflow> in the run's trace: its status
// and what failed.
func (w *workflows) traceEnd(ctx context.Context, run *workflow.Run) {
	h := nats.Header{}
	if run.TraceParent != "" {
		h.Set(traceParentHeader, run.TraceParent)
	}
	f := run.Failures()
	_, span := w.s.jobSpan(ctx, "workflow.end "+run.Workflow, h, attribute.String("jetfleet.workflow", run.Workflow),
		attribute.String("jetfleet.workflow_run", run.ID), attribute.String("jetfleet.workflow_status", string(run.Status)),
		attribute.Int("jetfleet.workflow_round", run.Round), attribute.Int("jetfleet.workflow_failed_steps", len(f.Steps)),
		attribute.Int("jetfleet.workflow_failed_elements", len(f.Elements)))
	if run.Status == workflow.StatusFailed {
		msg := f.Summary()
		if f.Empty() && run.Error != "" {
			msg = run.Error
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End()
}

// reportAsJob publishes the job event that stands for a run started as a
// job (its Trigger): started when it starts, then succeeded, dead (reason
// workflow_failed) or cancelled at the end of each round, so that the
// schedule that fired it sees its run end like any job's (overlap
// policies, dependency triggers, history). typ "" is the end's event.
func (w *workflows) reportAsJob(ctx context.Context, run *workflow.Run, typ string) error {
	trig := run.Trigger
	if trig == nil || trig.JobID == "" {
		return nil
	}
	ev := &jetfleetpb.JobEvent{JobId: trig.JobID, Queue: protocol.WorkflowJobQueue, Kind: run.Workflow,
		ScheduleId: trig.ScheduleID, Time: timestampNow(w.s.clk)}
	if protocol.ValidateToken("kind", run.Workflow) != nil {
		ev.Kind = "_invalid"
	}
	if t, err := time.Parse(time.RFC3339, trig.NominalTime); err == nil {
		ev.NominalTime = timestamppb.New(t)
	}
	switch {
	case typ != "":
		ev.Type = typ
	case run.Status == workflow.StatusSucceeded:
		ev.Type = protocol.EventSucceeded
	case run.Status == workflow.StatusCancelled:
		ev.Type, ev.Reason, ev.Error = protocol.EventCancelled, protocol.ReasonCancelled, "the workflow run was cancelled"
	default:
		f := run.Failures()
		ev.Type, ev.Reason = protocol.EventDead, reasonWorkflowFailed
		ev.Error = fmt.Sprintf("workflow run %s failed: %s", run.ID, f.Summary())
		if run.Error != "" {
			ev.Error = "workflow run " + run.ID + ": " + run.Error
		}
	}
	rctx, cancel := w.s.requestCtx(ctx)
	defer cancel()
	msgID := fmt.Sprintf("%s:workflow:%s:%d", ev.GetType(), run.ID, run.Round)
	if err := w.s.publishJobEvent(rctx, ev, msgID); err != nil {
		return fmt.Errorf("report run %s as job %s: %w", run.ID, trig.JobID, err)
	}
	return nil
}

// reasonWorkflowFailed is the reason of the dead event of a failed run's job.
const reasonWorkflowFailed = "workflow_failed"

// alert raises the run's one alert, listing every failed step and element.
func (w *workflows) alert(ctx context.Context, run *workflow.Run, f *workflow.Failures) {
	var b strings.Builder
	for _, sf := range f.Steps {
		fmt.Fprintf(&b, "step %s: %s\n", sf.Step, sf.Error)
	}
	for _, ef := range f.Elements {
		fmt.Fprintf(&b, "step %s element %d %s: %s\n", ef.Step, ef.Index, ef.Item, ef.Error)
	}
	summary := fmt.Sprintf("workflow %s run %s failed: %s", run.Workflow, run.ID, f.Summary())
	// The severity of the escalation policy's default: the per-job alerts
	// of the steps' dead letters are left out for this one.
	severity := w.s.cfg.Escalation.Default.Alert
	if severity == SeverityNone {
		return
	}
	w.s.alerter.raise(ctx, &jetfleetpb.Alert{Key: fmt.Sprintf("workflow_failed:%s:%d", run.ID, run.Round),
		Type: "workflow_failed", Severity: severity, Summary: summary, Error: b.String()})
}

// runSnapshot is what workflow events are told from: the run's and each
// step's status before a transition.
type runSnapshot struct {
	status workflow.Status // "" before the run starts
	round  int
	steps  map[string]workflow.Status
}

func snapshot(run *workflow.Run) runSnapshot {
	if run == nil {
		return runSnapshot{}
	}
	snap := runSnapshot{status: run.Status, round: run.Round, steps: make(map[string]workflow.Status, len(run.Steps))}
	for name, st := range run.Steps {
		snap.steps[name] = st.Status
	}
	return snap
}

// events are the workflow events of the change from before to run: a
// run's start and end, and each step's start and end (a step that starts
// again in a new round starts again).
func runEvents(before runSnapshot, run *workflow.Run, now time.Time) []protocol.WorkflowEvent {
	base := protocol.WorkflowEvent{Workflow: run.Workflow, RunID: run.ID, Round: run.Round, Time: now}
	if run.Trigger != nil {
		base.JobID = run.Trigger.JobID
	}
	if parts := strings.Split(run.TraceParent, "-"); len(parts) == 4 {
		base.TraceID = parts[1]
	}
	var evs []protocol.WorkflowEvent
	if before.status != workflow.StatusRunning && run.Status == workflow.StatusRunning {
		ev := base
		ev.Type = protocol.WorkflowRunStarted
		evs = append(evs, ev)
	}
	for _, s := range run.Def.Steps {
		st := run.Steps[s.Name]
		was := before.steps[s.Name]
		if was == st.Status && before.round == run.Round {
			continue
		}
		ev := base
		ev.Step = s.Name
		switch st.Status {
		case workflow.StatusRunning:
			ev.Type = protocol.WorkflowStepStarted
		case workflow.StatusSucceeded:
			ev.Type = protocol.WorkflowStepSucceeded
		case workflow.StatusFailed:
			ev.Type, ev.Error = protocol.WorkflowStepFailed, st.Error
		case workflow.StatusSkipped:
			ev.Type = protocol.WorkflowStepSkipped
		case workflow.StatusCancelled:
			ev.Type = protocol.WorkflowStepCancelled
		default:
			continue
		}
		if was == st.Status { // the same status in a new round: only a start is news
			if st.Status != workflow.StatusRunning || st.Round != run.Round {
				continue
			}
		}
		if s.IsFanOut() && st.Status != workflow.StatusRunning {
			ev.Elements = map[string]int{}
			for _, el := range st.Elements {
				ev.Elements[string(el.Status)]++
			}
		}
		evs = append(evs, ev)
	}
	if before.status == workflow.StatusRunning || before.status == "" {
		if run.Status.Ended() {
			ev := base
			f := run.Failures()
			ev.FailedSteps, ev.FailedElements, ev.Error = len(f.Steps), len(f.Elements), run.Error
			switch run.Status {
			case workflow.StatusSucceeded:
				ev.Type = protocol.WorkflowRunSucceeded
			case workflow.StatusCancelled:
				ev.Type = protocol.WorkflowRunCancelled
			default:
				ev.Type = protocol.WorkflowRunFailed
			}
			evs = append(evs, ev)
		}
	}
	return evs
}

// stampSteps records in run when each of its steps started and ended in the
// change from before, as its workflow events will say.
func stampSteps(before runSnapshot, run *workflow.Run, now time.Time) {
	for _, ev := range runEvents(before, run, now) {
		st := run.Steps[ev.Step]
		switch {
		case st == nil:
		case ev.Type == protocol.WorkflowStepStarted:
			st.StartedAt, st.EndedAt = &now, nil
		case protocol.IsWorkflowStepEnd(ev.Type):
			st.EndedAt = &now
		}
	}
}

// publishEvents stores workflow events and waits for the server; an event
// published again (a transition done again) is deduplicated by its id.
func (w *workflows) publishEvents(ctx context.Context, evs []protocol.WorkflowEvent) error {
	futures := make([]jetstream.PubAckFuture, 0, len(evs))
	for _, ev := range evs {
		data, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		msg := nats.NewMsg(protocol.WorkflowEventSubject(ev.Workflow, ev.Type, ev.RunID))
		msg.Data = data
		msg.Header.Set(protocol.HeaderMsgID, fmt.Sprintf("wfev:%s:%d:%s:%s", ev.RunID, ev.Round, ev.Step, ev.Type))
		f, err := w.s.js.PublishMsgAsync(msg)
		if err != nil {
			return fmt.Errorf("workflow event %s of run %s: %w", ev.Type, ev.RunID, err)
		}
		futures = append(futures, f)
	}
	if err := waitFutures(ctx, futures, workflowPublishTimeout); err != nil {
		return fmt.Errorf("workflow events: %w", err)
	}
	return nil
}
