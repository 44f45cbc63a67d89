package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	out, ok := stepOutcome(ev)
	if !ok {
		return
	}
	w.pending = append(w.pending, pendingOutcome{runID: runID, jobID: ev.GetJobId(), out: out})
}

// stepOutcome is the outcome a terminal event gives a step's job; false
// for an event that is not terminal. A success whose result is above the
// protocol's limit (a foreign agent's; the Go agent refuses it) fails the
// step: the next steps would be built from a result nobody should store.
func stepOutcome(ev *jetfleetpb.JobEvent) (workflow.Outcome, bool) {
	out := workflow.Outcome{Result: ev.GetResult()}
	switch ev.GetType() {
	case protocol.EventSucceeded:
		out.Status = workflow.StatusSucceeded
		if len(out.Result) > protocol.MaxResult {
			out.Status, out.Result = workflow.StatusFailed, nil
			out.Error = fmt.Sprintf("result too large: %d bytes, the protocol's limit is %d (agent %s)", len(ev.GetResult()), protocol.MaxResult, ev.GetAgentId())
		}
	case protocol.EventDead:
		out.Status, out.Error = workflow.StatusFailed, outcomeError(ev)
	case protocol.EventCancelled:
		out.Status, out.Error = workflow.StatusCancelled, outcomeError(ev)
	default:
		return out, false
	}
	if len(out.Result) == 0 {
		out.Result = nil
	}
	return out, true
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
		before := snapshot(run)
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
		stampSteps(before, run, now)
		data, acts, err := w.fit(run, acts)
		if err != nil {
			return nil, err
		}
		evs := runEvents(before, run, now)
		if err := w.act(ctx, run, acts, evs); err != nil {
			return nil, err
		}
		rctx, cancel := w.s.requestCtx(ctx)
		newRev, err := w.runs.Update(rctx, runID, data, rev)
		cancel()
		if err == nil {
			w.s.metrics.workflowTransition(ctx, run, acts, evs)
			w.remember(run, newRev)
			return detailIf(view, run), nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) && attempt < 3 {
			continue // another replica wrote it (a leader change): decide again from its state
		}
		return nil, fmt.Errorf("store workflow run %s: %w", runID, err)
	}
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

// act carries out a transition's actions: publish, cancel, alert, and
// records its workflow events.
func (w *workflows) act(ctx context.Context, run *workflow.Run, acts workflow.Actions, evs []protocol.WorkflowEvent) error {
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
	if err := w.publishEvents(ctx, evs); err != nil {
		return err
	}
	if acts.Ended {
		if err := w.reportAsJob(ctx, run, ""); err != nil {
			return err
		}
		w.traceEnd(ctx, run)
	}
	return nil
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
	if err := waitFutures(ctx, futures, workflowPublishTimeout); err != nil {
		return fmt.Errorf("publish the jobs of run %s: %w", run.ID, err)
	}
	return nil
}

// workflowPublishTimeout bounds the wait for the acks of one transition's
// jobs or events (a large fan-out's first jobs are thousands).
const workflowPublishTimeout = time.Minute

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
