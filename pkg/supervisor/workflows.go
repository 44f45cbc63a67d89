package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor/workflow"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// workflows runs workflow runs (docs/workflows.md). Definitions live in
// bucket workflows, each run's whole state in bucket workflow_runs. Only the
// leader changes a run: from the terminal events of its jobs (read in order
// by the events consumer, acked once the run is stored) and from the API's
// run, retry-failed and cancel, which other replicas forward to it.
//
// A transition reads the run, lets the state machine (package workflow)
// decide, carries out the actions — publish the jobs it starts, cancel the
// jobs it ends, raise the run's alert — and then stores the new state with
// a compare-and-set on the revision it read. Every action is safe to repeat:
// step job ids are deterministic (JetStream's duplicate window, then the
// agents' check for an already succeeded job, keep each to one execution),
// a cancel of an ended job does nothing, and the alert is deduplicated by
// its key. So a leader that dies between the actions and the store leaves
// an unacked event, and its successor handles it again to the same effect.
type workflows struct {
	s          *Supervisor
	defs, runs jetstream.KeyValue
	// mu serializes the transitions made on this replica.
	mu sync.Mutex
	// cache holds the runs this leader last stored (cachedRun), under mu.
	cache map[string]cachedRun
	// pending are the outcomes read from a batch of events and not yet
	// applied (flush): the events consumer's goroutine alone uses it.
	pending []pendingOutcome
}

// pendingOutcome is a step job's outcome waiting for its run's transition.
type pendingOutcome struct {
	runID, jobID string
	out          workflow.Outcome
}

// leaderWorkflowSubject receives the run, retry-failed and cancel requests
// that replicas which do not lead forward to the leader. It is outside
// jetfleet.supervisor.>, which stream SUPERVISOR captures: a request there
// would be stored, and its publish ack would answer it first.
const leaderWorkflowSubject = "jetfleet.workflows.leader"

// Operations forwarded on leaderWorkflowSubject.<op>.
const (
	opWorkflowRun         = "run"
	opWorkflowRetryFailed = "retry-failed"
	opWorkflowCancel      = "cancel"
)

// runStateHeadroom is kept free under the server's max payload for a run's
// stored state: the key-value message's headers.
const runStateHeadroom = 4 << 10

func (w *workflows) open(ctx context.Context) error {
	var err error
	if w.defs, err = w.s.js.KeyValue(ctx, protocol.BucketWorkflows); err != nil {
		return fmt.Errorf("bucket %s: %w", protocol.BucketWorkflows, err)
	}
	if w.runs, err = w.s.js.KeyValue(ctx, protocol.BucketWorkflowRuns); err != nil {
		return fmt.Errorf("bucket %s: %w", protocol.BucketWorkflowRuns, err)
	}
	return nil
}

// jobEnded takes the outcome of a workflow step's job from its terminal
// event (succeeded, dead or cancelled) for the run's next transition
// (flush, before the batch's events are acked).
func (w *workflows) jobEnded(ev *jetfleetpb.JobEvent) {
	runID, ok := protocol.WorkflowRunOfJob(ev.GetJobId())
	if !ok {
		return
	}
	out := workflow.Outcome{Result: ev.GetResult()}
	switch ev.GetType() {
	case protocol.EventSucceeded:
		out.Status = workflow.StatusSucceeded
	case protocol.EventDead:
		out.Status, out.Error = workflow.StatusFailed, outcomeError(ev)
	case protocol.EventCancelled:
		out.Status, out.Error = workflow.StatusCancelled, outcomeError(ev)
	default:
		return
	}
	if len(out.Result) == 0 {
		out.Result = nil
	}
	w.pending = append(w.pending, pendingOutcome{runID: runID, jobID: ev.GetJobId(), out: out})
}

// flush applies the pending outcomes, one transition per run for all of
// its outcomes in the batch (a fan-out's run is read and stored once per
// batch of events, not once per element), in the order they were read.
// Whatever happens, the pending list is cleared: on an error the batch's
// events are read again, and an outcome applied twice changes nothing.
func (w *workflows) flush(ctx context.Context) error {
	pending := w.pending
	w.pending = nil
	var order []string
	byRun := map[string][]pendingOutcome{}
	for _, p := range pending {
		if _, seen := byRun[p.runID]; !seen {
			order = append(order, p.runID)
		}
		byRun[p.runID] = append(byRun[p.runID], p)
	}
	for _, runID := range order {
		_, err := w.transition(ctx, runID, func(r *workflow.Run) (workflow.Actions, bool, error) {
			outs := make([]workflow.JobOutcome, len(byRun[runID]))
			for i, p := range byRun[runID] {
				outs[i] = workflow.JobOutcome{JobID: p.jobID, Outcome: p.out}
			}
			acts, changed, errs := r.JobsEnded(outs)
			for _, err := range errs {
				// Not a job this run knows (a definition changed under a
				// hand-made id): nothing to advance, nothing to retry.
				w.s.log.Warn("workflow job event ignored", "run", runID, telemetry.LogError, err)
			}
			return acts, changed, nil
		}, false)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			w.s.log.Warn("events of a workflow run that is not stored (expired or removed); ignored", "run", runID)
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func outcomeError(ev *jetfleetpb.JobEvent) string {
	e := firstLine(ev.GetError())
	switch {
	case e != "" && ev.GetReason() != "":
		return ev.GetReason() + ": " + e
	case e != "":
		return e
	}
	return ev.GetReason()
}

// transition applies change to the stored run runID (see workflows).
// change reports whether it changed the run; an unchanged run with no
// action to carry out is not stored again. view, when set, is the run as
// the transition left it, made before another transition can change it.
func (w *workflows) transition(ctx context.Context, runID string, change func(*workflow.Run) (workflow.Actions, bool, error),
	view bool) (*jetfleet.WorkflowRunDetail, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for attempt := 0; ; attempt++ {
		run, rev, cached := w.cached(runID)
		if !cached {
			var err error
			if run, rev, err = w.load(ctx, runID); err != nil {
				return nil, err
			}
		}
		// From here the state may change in memory before it is stored:
		// the cache holds it again only once it is.
		delete(w.cache, runID)
		acts, changed, err := change(run)
		if err != nil {
			return nil, err
		}
		if !changed && len(acts.Publish) == 0 && len(acts.Cancel) == 0 {
			w.remember(run, rev)
			return detailIf(view, run), nil
		}
		now := w.s.clk.Now().UTC()
		run.UpdatedAt = now
		if acts.Ended {
			run.EndedAt = &now
		}
		data, acts, err := w.fit(run, acts)
		if err != nil {
			return nil, err
		}
		if err := w.act(ctx, run, acts); err != nil {
			return nil, err
		}
		rctx, cancel := w.s.requestCtx(ctx)
		newRev, err := w.runs.Update(rctx, runID, data, rev)
		cancel()
		if err == nil {
			w.s.metrics.workflowTransition(ctx, run, acts)
			w.remember(run, newRev)
			return detailIf(view, run), nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) && attempt < 3 {
			continue // another replica wrote it (a leader change): decide again from its state
		}
		return nil, fmt.Errorf("store workflow run %s: %w", runID, err)
	}
}

func detailIf(view bool, run *workflow.Run) *jetfleet.WorkflowRunDetail {
	if !view {
		return nil
	}
	return runDetail(run)
}

// The leader keeps the runs it last stored, decoded, with their revision:
// a transition of a large fan-out's run then decodes nothing. The
// compare-and-set of the store checks that the revision is still the
// stored one; on a conflict the run is read again.
type cachedRun struct {
	run *workflow.Run
	rev uint64
}

// maxCachedRuns bounds the cache; an ended run leaves it.
const maxCachedRuns = 64

func (w *workflows) cached(runID string) (*workflow.Run, uint64, bool) {
	c, ok := w.cache[runID]
	return c.run, c.rev, ok
}

func (w *workflows) remember(run *workflow.Run, rev uint64) {
	if run.Status.Ended() {
		delete(w.cache, run.ID)
		return
	}
	if w.cache == nil || len(w.cache) >= maxCachedRuns {
		w.cache = map[string]cachedRun{}
	}
	w.cache[run.ID] = cachedRun{run: run, rev: rev}
}

// forget empties the cache (a replica that gains or loses leadership).
func (w *workflows) forget() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cache = nil
}

// fit encodes run for storage. A state the server cannot take in one
// message (a fan-out over a very long list, or large results) aborts the
// run, stating why, with the results of its elements dropped.
func (w *workflows) fit(run *workflow.Run, acts workflow.Actions) ([]byte, workflow.Actions, error) {
	data, err := json.Marshal(run)
	if err != nil {
		return nil, acts, err
	}
	limit := int(w.s.nc.MaxPayload()) - runStateHeadroom
	if len(data) <= limit {
		return data, acts, nil
	}
	reason := fmt.Sprintf("the run's state (%d bytes) does not fit in one message of at most %d bytes: "+
		"a fan-out over fewer elements, or smaller results, fits", len(data), limit)
	abort := run.Abort(reason)
	abort.Cancel = append(abort.Cancel, acts.Cancel...)
	abort.Publish = nil // the jobs it would have started do not go out
	for _, st := range run.Steps {
		for i := range st.Elements {
			st.Elements[i].Result = nil
		}
	}
	now := w.s.clk.Now().UTC()
	run.EndedAt = &now
	if data, err = json.Marshal(run); err != nil {
		return nil, acts, err
	}
	if len(data) > limit {
		for _, st := range run.Steps {
			st.Items = nil
		}
		if data, err = json.Marshal(run); err != nil {
			return nil, acts, err
		}
	}
	w.s.log.Error("workflow run aborted", "run", run.ID, "workflow", run.Workflow, "reason", reason)
	return data, abort, nil
}

// act carries out a transition's actions: publish, cancel, alert.
func (w *workflows) act(ctx context.Context, run *workflow.Run, acts workflow.Actions) error {
	if len(acts.Publish) > 0 {
		if err := w.publish(ctx, run, acts.Publish); err != nil {
			return err
		}
	}
	for _, id := range acts.Cancel {
		req := jetfleet.CancelRequest{JobID: id, Reason: "workflow run " + run.ID + " " + string(run.Status),
			RequestedBy: "workflow " + run.Workflow}
		if _, err := w.s.cancelJob(ctx, req); err != nil && !errors.Is(err, protocol.Code(protocol.CodeNotFound)) {
			return fmt.Errorf("cancel %s: %w", id, err)
		}
	}
	if acts.Alert != nil {
		w.alert(ctx, run, acts.Alert)
	}
	if acts.Ended {
		if err := w.reportAsJob(ctx, run, ""); err != nil {
			return err
		}
		w.traceEnd(ctx, run)
	}
	return nil
}

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
		span.SetStatus(codes.Error, fmt.Sprintf("%d steps and %d elements failed", len(f.Steps), len(f.Elements)))
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
		ev.Error = fmt.Sprintf("workflow run %s failed: %d steps and %d elements failed", run.ID, len(f.Steps), len(f.Elements))
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

// consumeStarts starts a run for every message on workflows.<name>
// (stream WORKFLOWS; durably, leader only). A message that cannot start
// one — an unknown workflow, an input that is not JSON — becomes a run
// that failed at once with the reason, listed with the others.
func (w *workflows) consumeStarts(ctx context.Context) {
	w.s.consume(ctx, protocol.StreamWorkflows, 64, func(ctx context.Context, msgs []jetstream.Msg) {
		for _, m := range msgs {
			if err := w.startFromMessage(ctx, m); err != nil {
				if ctx.Err() == nil {
					w.s.log.Warn("workflow start not handled; it is tried again", "subject", m.Subject(), telemetry.LogError, err)
				}
				_ = m.NakWithDelay(time.Second)
				continue
			}
			_ = m.Ack()
		}
	})
}

func (w *workflows) startFromMessage(ctx context.Context, m jetstream.Msg) error {
	meta, err := m.Metadata()
	if err != nil {
		return nil //nolint:nilerr // not a JetStream message
	}
	h := m.Headers()
	name := strings.TrimPrefix(m.Subject(), "workflows.")
	var trig *workflow.Trigger
	if id := h.Get(protocol.HeaderJobID); id != "" && protocol.ValidateJobID(id) == nil {
		trig = &workflow.Trigger{JobID: id, ScheduleID: h.Get(protocol.HeaderScheduleID), NominalTime: h.Get(protocol.HeaderNominalTime)}
	}
	runID := h.Get(protocol.HeaderRunID)
	if runID == "" {
		runID = derivedRunID(h.Get(protocol.HeaderMsgID), meta.Sequence.Stream)
		if trig != nil {
			runID = derivedRunID(trig.JobID, meta.Sequence.Stream)
		}
	}
	input := m.Data()
	refuse := func(reason string) error { return w.refuse(ctx, name, runID, input, trig, reason) }
	switch {
	case protocol.ValidateWorkflowName("run id", runID) != nil:
		runID = derivedRunID("", meta.Sequence.Stream)
		return refuse(fmt.Sprintf("header %s %q is not a run id: 1 to 64 of A-Z a-z 0-9 - _", protocol.HeaderRunID, h.Get(protocol.HeaderRunID)))
	case protocol.ValidateWorkflowName("workflow", name) != nil:
		return refuse(fmt.Sprintf("subject %s does not name a workflow: workflows.<name>, a name of 1 to 64 of A-Z a-z 0-9 - _", m.Subject()))
	case len(input) > 0 && !json.Valid(input):
		return refuse("the message's body is not JSON: a run's input is a JSON value")
	}
	_, err = w.start(ctx, jetfleet.WorkflowRunRequest{Workflow: name, RunID: runID, Input: input}, trig, h)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, protocol.Code(protocol.CodeNotFound)), errors.Is(err, protocol.Code(protocol.CodeInvalidArgument)):
		return refuse(err.Error())
	}
	return err
}

// derivedRunID is the run id of a start message without Jetfleet-Run-Id:
// from its job or message id (deterministic, so that the same message sent
// again starts nothing), else WORKFLOWS-<stream sequence>.
func derivedRunID(id string, seq uint64) string {
	if id == "" {
		return protocol.StreamWorkflows + "-" + strconv.FormatUint(seq, 10)
	}
	if protocol.ValidateWorkflowName("run id", id) == nil {
		return id
	}
	clean := []byte(id)
	for i, c := range clean {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			clean[i] = '-'
		}
	}
	if len(clean) <= protocol.MaxWorkflowNameLength {
		return string(clean)
	}
	sum := sha256.Sum256([]byte(id))
	return string(clean[:protocol.MaxWorkflowNameLength-17]) + "-" + hex.EncodeToString(sum[:8])
}

// refuse records a start message that cannot start a run as a run that
// failed at once, with reason as its error (and its job's dead event).
func (w *workflows) refuse(ctx context.Context, name, runID string, input []byte, trig *workflow.Trigger, reason string) error {
	now := w.s.clk.Now().UTC()
	run := &workflow.Run{ID: runID, Workflow: name, Status: workflow.StatusFailed, Error: reason, Trigger: trig,
		Steps: map[string]*workflow.StepState{}, StartedAt: now, UpdatedAt: now, EndedAt: &now}
	if json.Valid(input) {
		run.Input = input
	}
	data, err := json.Marshal(run)
	if err != nil {
		return err
	}
	rctx, cancel := w.s.requestCtx(ctx)
	defer cancel()
	if _, err := w.runs.Create(rctx, runID, data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil // refused before, or a run of that id exists: nothing to start
		}
		return err
	}
	w.s.log.Warn("workflow start refused", "run", runID, "workflow", name, "reason", reason)
	w.alert(ctx, run, &workflow.Failures{Steps: []workflow.StepFailure{{Step: "(run)", Error: reason}}})
	w.s.metrics.workflowRuns.Add(ctx, 1, attrs("workflow", name, "event", "refused"))
	return w.reportAsJob(ctx, run, "")
}

// publish sends the jobs of a transition at once and waits for every ack.
func (w *workflows) publish(ctx context.Context, run *workflow.Run, jobs []workflow.Job) error {
	futures := make([]jetstream.PubAckFuture, 0, len(jobs))
	for _, j := range jobs {
		h := nats.Header{}
		if run.TraceParent != "" {
			h.Set(traceParentHeader, run.TraceParent)
		}
		h.Set(protocol.HeaderWorkflowRun, run.ID)
		h.Set(protocol.HeaderWorkflowStep, j.Step)
		job := protocol.Job{ID: j.ID, Queue: j.Queue, Kind: j.Kind, Payload: j.Payload, Timeout: j.Timeout,
			MaxAttempts: j.Attempts, Backoff: j.Backoff, Header: h}
		msg, err := job.Msg()
		if err != nil {
			return fmt.Errorf("job %s of step %s: %w", j.ID, j.Step, err)
		}
		f, err := w.s.js.PublishMsgAsync(msg)
		if err != nil {
			return fmt.Errorf("publish %s: %w", j.ID, err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("publish %s: %w", f.Msg().Header.Get(protocol.HeaderJobID), err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// alert raises the run's one alert, listing every failed step and element.
func (w *workflows) alert(ctx context.Context, run *workflow.Run, f *workflow.Failures) {
	var b strings.Builder
	for _, sf := range f.Steps {
		fmt.Fprintf(&b, "step %s: %s\n", sf.Step, sf.Error)
	}
	for _, ef := range f.Elements {
		fmt.Fprintf(&b, "step %s element %d %s: %s\n", ef.Step, ef.Index, ef.Item, ef.Error)
	}
	summary := fmt.Sprintf("workflow %s run %s failed: %d steps and %d elements failed", run.Workflow, run.ID,
		len(f.Steps), len(f.Elements))
	// The severity of the escalation policy's default: the per-job alerts
	// of the steps' dead letters are left out for this one.
	severity := w.s.cfg.Escalation.Default.Alert
	if severity == SeverityNone {
		return
	}
	w.s.alerter.raise(ctx, &jetfleetpb.Alert{Key: fmt.Sprintf("workflow_failed:%s:%d", run.ID, run.Round),
		Type: "workflow_failed", Severity: severity, Summary: summary, Error: b.String()})
}

func (w *workflows) load(ctx context.Context, runID string) (*workflow.Run, uint64, error) {
	rctx, cancel := w.s.requestCtx(ctx)
	defer cancel()
	e, err := w.runs.Get(rctx, runID)
	if err != nil {
		return nil, 0, err
	}
	var run workflow.Run
	if err := json.Unmarshal(e.Value(), &run); err != nil {
		return nil, 0, fmt.Errorf("workflow run %s: stored state: %w", runID, err)
	}
	return &run, e.Revision(), nil
}

// start begins a run of a stored workflow: it publishes the first steps'
// jobs, then creates the run. A run id already stored starts nothing.
func (w *workflows) start(ctx context.Context, req jetfleet.WorkflowRunRequest, trig *workflow.Trigger, parent nats.Header) (*jetfleet.WorkflowRunResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if req.RunID == "" {
		req.RunID = nuid.Next()
	}
	rctx, cancel := w.s.requestCtx(ctx)
	defer cancel()
	if e, err := w.runs.Get(rctx, req.RunID); err == nil {
		var run workflow.Run
		_ = json.Unmarshal(e.Value(), &run)
		return &jetfleet.WorkflowRunResponse{RunID: req.RunID, Duplicate: true, Status: string(run.Status)}, nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, internal(err)
	}
	if _, err := w.runs.Get(rctx, startIntentKey(req.RunID)); err == nil {
		// An earlier start of this id got as far as its intent: finish it.
		run, err := w.finishStart(ctx, req.RunID)
		if err != nil {
			return nil, internal(err)
		}
		return &jetfleet.WorkflowRunResponse{RunID: req.RunID, Duplicate: true, Status: string(run.Status)}, nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, internal(err)
	}
	def, _, err := w.definition(rctx, req.Workflow)
	if err != nil {
		return nil, err
	}
	run, acts, err := workflow.Start(*def, req.RunID, req.Input)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	}
	run.Trigger = trig
	run.TraceParent = w.traceStart(ctx, run, parent)
	now := w.s.clk.Now().UTC()
	run.StartedAt, run.UpdatedAt = now, now
	if err := w.reportAsJob(ctx, run, protocol.EventStarted); err != nil {
		return nil, internal(err)
	}
	if acts.Ended {
		run.EndedAt = &now
	}
	data, acts, err := w.fit(run, acts)
	if err != nil {
		return nil, internal(err)
	}
	// The intent first: a leader that dies after publishing the first jobs
	// and before creating the run leaves it, and the next leader finishes
	// the start from it (recoverStarts), so no job runs for a run that is
	// never stored.
	if _, err := w.runs.Put(rctx, startIntentKey(req.RunID), data); err != nil {
		return nil, internal(fmt.Errorf("store the start of run %s: %w", req.RunID, err))
	}
	if err := w.act(ctx, run, acts); err != nil {
		return nil, internal(err)
	}
	// Its own bound: publishing a large fan-out's first jobs may have used
	// up rctx.
	cctx, ccancel := w.s.requestCtx(context.WithoutCancel(ctx))
	defer ccancel()
	rev, err := w.runs.Create(cctx, req.RunID, data)
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, internal(err) // the intent stays: a new start of this id, or the next leader, finishes it
	}
	_ = w.runs.Delete(cctx, startIntentKey(req.RunID))
	if err != nil {
		return &jetfleet.WorkflowRunResponse{RunID: req.RunID, Duplicate: true, Status: string(run.Status)}, nil
	}
	w.remember(run, rev)
	w.s.metrics.workflowTransition(ctx, run, acts)
	w.s.log.Info("workflow run started", "run", run.ID, "workflow", run.Workflow, "jobs", len(acts.Publish))
	return &jetfleet.WorkflowRunResponse{RunID: req.RunID, Status: string(run.Status)}, nil
}

// startIntentKey is the key in bucket workflow_runs of a start under way:
// the run's first state, written before its first jobs are published. Run
// ids are tokens, so it never names a run.
func startIntentKey(runID string) string { return startIntentPrefix + runID }

const startIntentPrefix = "starting."

// finishStart finishes the start of runID from its intent: it publishes the
// run's running jobs again (their ids make that harmless), reports the run
// as its job and creates the run, unless it exists; then drops the intent.
func (w *workflows) finishStart(ctx context.Context, runID string) (*workflow.Run, error) {
	rctx, cancel := w.s.requestCtx(context.WithoutCancel(ctx))
	defer cancel()
	e, err := w.runs.Get(rctx, startIntentKey(runID))
	if err != nil {
		return nil, err
	}
	var run workflow.Run
	if err := json.Unmarshal(e.Value(), &run); err != nil {
		return nil, fmt.Errorf("start of run %s: %w", runID, err)
	}
	if stored, _, err := w.load(ctx, runID); err == nil {
		_ = w.runs.Delete(rctx, startIntentKey(runID))
		return stored, nil
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	if err := w.reportAsJob(ctx, &run, protocol.EventStarted); err != nil {
		return nil, err
	}
	acts := workflow.Actions{Publish: run.RunningJobs(), Ended: run.EndedAt != nil}
	if run.Status == workflow.StatusFailed {
		f := run.Failures()
		acts.Alert = &f
	}
	if err := w.act(ctx, &run, acts); err != nil {
		return nil, err
	}
	if _, err := w.runs.Create(rctx, runID, e.Value()); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, err
	}
	_ = w.runs.Delete(rctx, startIntentKey(runID))
	w.s.log.Info("finished a workflow run's start left by an earlier leader", "run", runID, "jobs", len(acts.Publish))
	return &run, nil
}

// recoverStarts finishes, once per leadership, the starts an earlier leader
// left under way (their intents).
func (w *workflows) recoverStarts(ctx context.Context) {
	for ctx.Err() == nil {
		keys, err := w.intents(ctx)
		if err == nil {
			for _, key := range keys {
				w.mu.Lock()
				_, err = w.finishStart(ctx, strings.TrimPrefix(key, startIntentPrefix))
				w.mu.Unlock()
				if err != nil {
					break
				}
			}
		}
		if err == nil {
			return
		}
		w.s.log.Warn("cannot finish the workflow starts an earlier leader left; retrying", telemetry.LogError, err)
		sleepCtx(ctx, time.Second)
	}
}

// intents lists the keys of the starts under way.
func (w *workflows) intents(ctx context.Context) ([]string, error) {
	watcher, err := w.runs.Watch(ctx, startIntentPrefix+"*", jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		return nil, err
	}
	defer func() { _ = watcher.Stop() }()
	var keys []string
	for {
		select {
		case e := <-watcher.Updates():
			if e == nil {
				return keys, nil
			}
			keys = append(keys, e.Key())
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (w *workflows) definition(ctx context.Context, name string) (*protocol.WorkflowDefinition, jetstream.KeyValueEntry, error) {
	if err := protocol.ValidateWorkflowName("workflow", name); err != nil {
		return nil, nil, protocol.FieldError("workflow", "%v", err)
	}
	e, err := w.defs.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil, protocol.Errorf(protocol.CodeNotFound, "no workflow %q (jetfleet workflow ls lists them)", name)
	}
	if err != nil {
		return nil, nil, internal(err)
	}
	def, err := protocol.ParseWorkflowDefinition(e.Value())
	if err != nil {
		return nil, nil, internal(fmt.Errorf("stored workflow %s: %w", name, err))
	}
	return def, e, nil
}

// lead serves, while this replica leads, the requests other replicas
// forward to the leader.
func (w *workflows) lead(ctx context.Context) {
	sub, err := w.s.nc.Subscribe(leaderWorkflowSubject+".*", func(msg *nats.Msg) {
		op := strings.TrimPrefix(msg.Subject, leaderWorkflowSubject+".")
		rctx, cancel := context.WithTimeout(ctx, 5*w.s.cfg.RequestTimeout)
		defer cancel()
		res, err := w.leaderOp(rctx, op, msg.Data)
		reply := nats.NewMsg(msg.Reply)
		if err != nil {
			doc := protocol.ToDoc(protocol.AsAPIError(err))
			reply.Header.Set(micro.ErrorCodeHeader, protocol.HTTPStatus(doc.GetCode()))
			reply.Header.Set(micro.ErrorHeader, doc.GetMessage())
			reply.Data, _ = protocol.Marshal(doc)
		} else {
			reply.Data, _ = json.Marshal(res)
		}
		_ = msg.RespondMsg(reply)
	})
	if err != nil {
		w.s.log.Error("cannot serve forwarded workflow requests", telemetry.LogError, err)
		return
	}
	<-ctx.Done()
	_ = sub.Unsubscribe()
}

// forwarding runs op here when this replica leads, else on the leader.
func (w *workflows) forwarding(op string) protocol.APIHandlerFunc {
	return func(ctx context.Context, data []byte) (any, error) {
		if w.s.IsLeader() {
			return w.leaderOp(ctx, op, data)
		}
		msg, err := w.s.nc.RequestWithContext(ctx, leaderWorkflowSubject+"."+op, data)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, protocol.Errorf(protocol.CodeUnavailable, "no supervisor leader right now; try again")
		}
		if err != nil {
			return nil, internal(err)
		}
		return nil, &protocol.Forwarded{Reply: msg}
	}
}

func (w *workflows) leaderOp(ctx context.Context, op string, data []byte) (any, error) {
	if !w.s.IsLeader() {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "this supervisor replica no longer leads; try again")
	}
	if op == opWorkflowRun {
		var req jetfleet.WorkflowRunRequest
		if err := protocol.DecodeRequest(data, &req); err != nil {
			return nil, err
		}
		if req.RunID != "" {
			if err := protocol.ValidateWorkflowName("run id", req.RunID); err != nil {
				return nil, protocol.FieldError("run_id", "%v", err)
			}
		}
		if len(req.Input) > 0 && !json.Valid(req.Input) {
			return nil, protocol.FieldError("input", "is not a JSON value")
		}
		return w.start(ctx, req, nil, nil)
	}
	var req jetfleet.WorkflowRunIDRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := protocol.ValidateWorkflowName("run id", req.RunID); err != nil {
		return nil, protocol.FieldError("run_id", "%v", err)
	}
	var change func(*workflow.Run) (workflow.Actions, bool, error)
	switch op {
	case opWorkflowRetryFailed:
		change = func(r *workflow.Run) (workflow.Actions, bool, error) {
			acts, err := r.RetryFailed()
			if err != nil {
				return acts, false, protocol.Errorf(protocol.CodeConflict, "run %s: %v", r.ID, err)
			}
			return acts, true, nil
		}
	case opWorkflowCancel:
		change = func(r *workflow.Run) (workflow.Actions, bool, error) {
			if r.Status != workflow.StatusRunning {
				return workflow.Actions{}, false, protocol.Errorf(protocol.CodeConflict, "run %s has ended (%s)", r.ID, r.Status)
			}
			return r.Cancel(), true, nil
		}
	default:
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "unknown operation %q", op)
	}
	detail, err := w.transition(ctx, req.RunID, change, true)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, protocol.Errorf(protocol.CodeNotFound, "no workflow run %q", req.RunID)
	}
	if err != nil {
		return nil, err
	}
	return detail, nil
}

// The API (every replica): definitions, and reading runs.

func (w *workflows) apiAdd(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.WorkflowAddRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if len(req.Definition) == 0 {
		return nil, protocol.FieldError("definition", "is required")
	}
	def, err := protocol.ParseWorkflowDefinition(req.Definition)
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "%v", err)
	}
	doc, err := json.Marshal(def)
	if err != nil {
		return nil, internal(err)
	}
	if len(doc) > int(w.s.nc.MaxPayload())-runStateHeadroom {
		return nil, protocol.FieldError("definition", "of %d bytes does not fit in one message", len(doc))
	}
	rev, err := w.defs.Put(ctx, def.Name, doc)
	if err != nil {
		return nil, internal(err)
	}
	w.s.log.Info("workflow stored", "workflow", def.Name, "revision", rev, "steps", len(def.Steps))
	return &jetfleet.WorkflowInfo{Name: def.Name, Description: def.Description, Steps: len(def.Steps), Revision: rev,
		Updated: w.s.clk.Now().UTC(), Definition: def}, nil
}

func (w *workflows) apiGet(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.WorkflowNameRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	def, e, err := w.definition(ctx, req.Name)
	if err != nil {
		if errors.Is(err, protocol.Code(protocol.CodeInvalidArgument)) {
			return nil, protocol.FieldError("name", "%v", err)
		}
		return nil, err
	}
	return &jetfleet.WorkflowInfo{Name: def.Name, Description: def.Description, Steps: len(def.Steps),
		Revision: e.Revision(), Updated: e.Created(), Definition: def}, nil
}

func (w *workflows) apiList(ctx context.Context, data []byte) (any, error) {
	if err := protocol.DecodeRequest(data, &struct{}{}); err != nil {
		return nil, err
	}
	res := &jetfleet.WorkflowList{Workflows: []jetfleet.WorkflowInfo{}}
	err := w.each(ctx, w.defs, func(e jetstream.KeyValueEntry) {
		def, err := protocol.ParseWorkflowDefinition(e.Value())
		if err != nil {
			w.s.log.Warn("stored workflow unreadable; not listed", "workflow", e.Key(), telemetry.LogError, err)
			return
		}
		res.Workflows = append(res.Workflows, jetfleet.WorkflowInfo{Name: def.Name, Description: def.Description,
			Steps: len(def.Steps), Revision: e.Revision(), Updated: e.Created()})
	})
	if err != nil {
		return nil, internal(err)
	}
	slices.SortFunc(res.Workflows, func(a, b jetfleet.WorkflowInfo) int { return strings.Compare(a.Name, b.Name) })
	return res, nil
}

func (w *workflows) apiRemove(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.WorkflowNameRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if _, _, err := w.definition(ctx, req.Name); err != nil {
		if errors.Is(err, protocol.Code(protocol.CodeInvalidArgument)) {
			return nil, protocol.FieldError("name", "%v", err)
		}
		return nil, err
	}
	if err := w.defs.Delete(ctx, req.Name); err != nil {
		return nil, internal(err)
	}
	return struct{}{}, nil
}

func (w *workflows) apiRuns(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.WorkflowRunsRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	limit := req.Limit
	if limit == 0 {
		limit = 100
	}
	runs := []jetfleet.WorkflowRunSummary{}
	err := w.each(ctx, w.runs, func(e jetstream.KeyValueEntry) {
		if strings.HasPrefix(e.Key(), startIntentPrefix) {
			return // a start under way: listed once it is a run
		}
		var run workflow.Run
		if err := json.Unmarshal(e.Value(), &run); err != nil {
			w.s.log.Warn("stored workflow run unreadable; not listed", "run", e.Key(), telemetry.LogError, err)
			return
		}
		if (req.Workflow != "" && run.Workflow != req.Workflow) || (req.Status != "" && string(run.Status) != req.Status) {
			return
		}
		runs = append(runs, runSummary(&run))
	})
	if err != nil {
		return nil, internal(err)
	}
	slices.SortFunc(runs, func(a, b jetfleet.WorkflowRunSummary) int {
		if c := b.StartedAt.Compare(a.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.RunID, b.RunID)
	})
	truncated := len(runs) > limit
	if truncated {
		runs = runs[:limit]
	}
	return map[string]any{"runs": runs, "truncated": truncated}, nil
}

func (w *workflows) apiRunGet(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.WorkflowRunIDRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := protocol.ValidateWorkflowName("run id", req.RunID); err != nil {
		return nil, protocol.FieldError("run_id", "%v", err)
	}
	run, _, err := w.load(ctx, req.RunID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, protocol.Errorf(protocol.CodeNotFound, "no workflow run %q", req.RunID)
	}
	if err != nil {
		return nil, internal(err)
	}
	return runDetail(run), nil
}

// each calls fn with every current entry of bucket kv.
func (w *workflows) each(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry)) error {
	watcher, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = watcher.Stop() }()
	for {
		select {
		case e := <-watcher.Updates():
			if e == nil {
				return nil // the initial values are all delivered
			}
			fn(e)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func runSummary(r *workflow.Run) jetfleet.WorkflowRunSummary {
	f := r.Failures()
	sum := jetfleet.WorkflowRunSummary{RunID: r.ID, Workflow: r.Workflow, Status: string(r.Status), Round: r.Round,
		StartedAt: r.StartedAt, UpdatedAt: r.UpdatedAt, EndedAt: r.EndedAt,
		FailedSteps: len(f.Steps), FailedElements: len(f.Elements), Error: r.Error}
	if r.Trigger != nil {
		sum.JobID, sum.ScheduleID = r.Trigger.JobID, r.Trigger.ScheduleID
	}
	return sum
}

func runDetail(r *workflow.Run) *jetfleet.WorkflowRunDetail {
	d := &jetfleet.WorkflowRunDetail{WorkflowRunSummary: runSummary(r), Input: r.Input}
	for _, s := range r.Def.Steps {
		st := r.Steps[s.Name]
		v := jetfleet.WorkflowStepView{Name: s.Name, Kind: s.Kind, Queue: s.QueueOrDefault(), DependsOn: s.DependsOn,
			When: s.When, Status: string(st.Status), JobID: protocol.WorkflowStepJobID(r.ID, s.Name, -1, st.Round),
			Result: st.Result, Error: st.Error, Round: st.Round}
		if s.IsFanOut() {
			v.Elements = map[string]int{}
			for _, el := range st.Elements {
				v.Elements[string(el.Status)]++
			}
		}
		d.Steps = append(d.Steps, v)
	}
	f := r.Failures()
	for _, sf := range f.Steps {
		d.Failures.Steps = append(d.Failures.Steps, jetfleet.WorkflowStepFailure{Step: sf.Step, Error: sf.Error,
			JobID: protocol.WorkflowStepJobID(r.ID, sf.Step, -1, r.Steps[sf.Step].Round)})
	}
	for _, ef := range f.Elements {
		d.Failures.Elements = append(d.Failures.Elements, jetfleet.WorkflowElementFailure{Step: ef.Step, Index: ef.Index,
			Item: ef.Item, Error: ef.Error,
			JobID: protocol.WorkflowStepJobID(r.ID, ef.Step, ef.Index, r.Steps[ef.Step].Elements[ef.Index].Round)})
	}
	return d
}
