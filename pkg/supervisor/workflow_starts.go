package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor/workflow"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// How workflow runs start: the API, one message on workflows.<name> (a
// schedule's fire is one), and the finishing of a start a leader left
// under way.

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
	stampSteps(snapshot(nil), run, now)
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
	evs := runEvents(snapshot(nil), run, now)
	if err := w.act(ctx, run, acts, evs); err != nil {
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
	w.s.metrics.workflowTransition(ctx, run, acts, evs)
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
	if err := w.act(ctx, &run, acts, runEvents(snapshot(nil), &run, w.s.clk.Now().UTC())); err != nil {
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
	entries, err := protocol.ReadBucket(ctx, w.s.js, w.runs, startIntentPrefix+"*", true)
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(entries))
	for _, e := range entries {
		keys = append(keys, e.Key())
	}
	return keys, nil
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
