package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor/workflow"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// The workflow API: definitions and reading runs on every replica; run,
// retry-failed and cancel on the leader, forwarded to it by the others.

// leaderWorkflowSubject receives the run, retry-failed and cancel requests
// that replicas which do not lead forward to the leader. It is outside
// jetfleet.supervisor.>, which stream SUPERVISOR captures: a request there
// would be stored, and its publish ack would answer it first.
const leaderWorkflowSubject = "jetfleet.workflows.leader"

func detailIf(view bool, run *workflow.Run) *jetfleet.WorkflowRunDetail {
	if !view {
		return nil
	}
	return runDetail(run)
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
	entries, err := protocol.ReadBucket(ctx, w.s.js, kv, ">", false)
	if err != nil {
		return err
	}
	for _, e := range entries {
		fn(e)
	}
	return nil
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
			Result: st.Result, Error: st.Error, Round: st.Round, StartedAt: st.StartedAt, EndedAt: st.EndedAt}
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
