package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// The workflow pages (docs/workflows.md): the definitions and the latest
// runs (/workflows), and a page per run (/workflows/runs/<run id>) that
// draws its graph with each step's state, lists what failed, and offers
// the operator's retry of the failed work and the run's cancel.

// workflowTopic is the live topic of a run's page.
func workflowTopic(runID string) string { return "workflow:" + runID }

// workflowRunOfJob returns the run of a workflow step's job id
// (wf:<run>:<step>[:<element>][~<round>], docs/protocol.md §8.1).
func workflowRunOfJob(jobID string) (string, bool) {
	rest, ok := strings.CutPrefix(jobID, "wf:")
	if !ok {
		return "", false
	}
	run, _, ok := strings.Cut(rest, ":")
	return run, ok && run != ""
}

// workflowFilter is what /workflows's query string asks for.
type workflowFilter struct {
	Workflow string
	Status   string
	Limit    int
}

// workflowRunStatuses are the statuses a run list filters by.
var workflowRunStatuses = []string{jetfleet.WorkflowRunning, jetfleet.WorkflowSucceeded, jetfleet.WorkflowFailed, jetfleet.WorkflowCancelled}

// parseWorkflowFilter reads /workflows's filter: workflow (a workflow's
// name), status (a run's) and limit (1 to 1000), nothing else.
func parseWorkflowFilter(q url.Values) (workflowFilter, error) {
	var f workflowFilter
	for k, vs := range q {
		switch k {
		case "workflow", "status", "limit", "fragment":
		default:
			return f, &queryError{shorten(k, 64), "is not a filter of this page (workflow, status, limit)"}
		}
		if len(vs) > 1 {
			return f, &queryError{k, "is given more than once"}
		}
	}
	if v := strings.TrimSpace(q.Get("workflow")); v != "" {
		if err := protocol.ValidateWorkflowName("workflow name", shorten(v, 200)); err != nil {
			return f, &queryError{"workflow", err.Error()}
		}
		f.Workflow = v
	}
	if v := strings.TrimSpace(q.Get("status")); v != "" {
		if !slices.Contains(workflowRunStatuses, v) {
			return f, &queryError{"status", fmt.Sprintf("must be one of %s; got %q", strings.Join(workflowRunStatuses, ", "), shorten(v, 64))}
		}
		f.Status = v
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > jetfleet.MaxWorkflowRunsLimit {
			return f, &queryError{"limit", fmt.Sprintf("must be a number from 1 to %d", jetfleet.MaxWorkflowRunsLimit)}
		}
		f.Limit = n
	}
	return f, nil
}

func (f workflowFilter) values() url.Values {
	q := url.Values{}
	if f.Workflow != "" {
		q.Set("workflow", f.Workflow)
	}
	if f.Status != "" {
		q.Set("status", f.Status)
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	return q
}

type workflowListBody struct {
	Filter      workflowFilter
	Statuses    []string
	Definitions []jetfleet.WorkflowInfo
	// Names are the workflows to filter by: those defined, and the one
	// filtered by when it is defined no more.
	Names []string
	Runs  []jetfleet.WorkflowRunSummary
	// Limit is the number of runs asked for; Full says the list may go on.
	Limit int
	Full  bool
}

func (d *Dashboard) workflowList(w http.ResponseWriter, r *http.Request) {
	f, err := parseWorkflowFilter(r.URL.Query())
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	limit := f.Limit
	if limit == 0 {
		limit = d.cfg.PageSize
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	defs, err := d.client.Workflows(ctx)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	runs, err := d.client.WorkflowRuns(ctx, jetfleet.WorkflowRunsRequest{Workflow: f.Workflow, Status: f.Status, Limit: limit})
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	slices.SortFunc(defs, func(a, b jetfleet.WorkflowInfo) int { return strings.Compare(a.Name, b.Name) })
	b := &workflowListBody{Filter: f, Statuses: workflowRunStatuses, Definitions: defs, Runs: runs, Limit: limit, Full: len(runs) >= limit}
	for _, def := range defs {
		b.Names = append(b.Names, def.Name)
	}
	if f.Workflow != "" && !slices.Contains(b.Names, f.Workflow) {
		b.Names = append(b.Names, f.Workflow)
	}
	d.render(w, r, http.StatusOK, "workflows", page{Title: "Workflows", Nav: "workflows", Live: "workflows", Query: f.values(), Body: b})
}

type workflowRunBody struct {
	Run         *jetfleet.WorkflowRunDetail
	Description string
	Input       *payloadView
	Graph       *graph
	Steps       []workflowStepRow
	Elements    []workflowElementRow
	FailedSteps []jetfleet.WorkflowStepFailure
	Actions     []workflowAction
	// CanRetry and CanCancel say which operator actions apply.
	CanRetry, CanCancel bool
	Duration            time.Duration
}

// workflowStepRow is one line of the steps table.
type workflowStepRow struct {
	jetfleet.WorkflowStepView
	FanOut bool
	Counts string
	// Job links the step's job, when it has one that ran.
	Job    string
	Result string
}

// workflowElementRow is one failed fan-out element.
type workflowElementRow struct {
	jetfleet.WorkflowElementFailure
	ItemText string
}

// workflowAction is an operator action recorded on the run.
type workflowAction struct {
	Time    time.Time
	Action  string
	Actor   string
	Outcome string
	Error   string
	Detail  string
}

func (d *Dashboard) workflowRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := protocol.ValidateWorkflowName("run id", id); err != nil {
		d.fail(w, r, http.StatusNotFound, "No workflow run "+shorten(id, 200)+": "+err.Error())
		return
	}
	if _, err := parseFilter(r.URL.Query(), d.now(), 0); err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	run, err := d.client.WorkflowRun(ctx, id)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	b := &workflowRunBody{Run: run, FailedSteps: run.Failures.Steps,
		CanRetry:  run.EndedAt != nil && run.FailedSteps+run.FailedElements > 0,
		CanCancel: run.Status == jetfleet.WorkflowRunning}
	end := d.now()
	if run.EndedAt != nil {
		end = *run.EndedAt
	}
	b.Duration = end.Sub(run.StartedAt)
	if len(run.Input) > 0 && string(run.Input) != "null" {
		p := decodePayload(run.Input)
		b.Input = &p
	}
	// The workflow's current definition, for its description and which
	// steps are fan-outs before their lists are known: a run keeps the
	// version it started with, so a step the current one lacks is drawn
	// from the run alone.
	fanOut := map[string]bool{}
	if info, err := d.client.Workflow(ctx, run.Workflow); err == nil && info.Definition != nil {
		b.Description = info.Description
		for _, s := range info.Definition.Steps {
			fanOut[s.Name] = len(s.ForEach) > 0
		}
	}
	b.Graph = graphLayout(run.Steps, fanOut)
	for _, s := range run.Steps {
		row := workflowStepRow{WorkflowStepView: s, FanOut: s.Elements != nil || fanOut[s.Name]}
		if row.FanOut {
			counts, _ := elementCounts(s.Elements)
			row.Counts = countsText(counts)
		} else if s.Status != jetfleet.WorkflowWaiting && s.Status != jetfleet.WorkflowSkipped && s.JobID != "" {
			row.Job = s.JobID
		}
		if len(s.Result) > 0 && string(s.Result) != "null" {
			row.Result = shorten(compactJSON(s.Result), 160)
		}
		b.Steps = append(b.Steps, row)
	}
	for _, e := range run.Failures.Elements {
		b.Elements = append(b.Elements, workflowElementRow{WorkflowElementFailure: e, ItemText: shorten(compactJSON(e.Item), 200)})
	}
	b.Actions = d.workflowActions(ctx, id, run.StartedAt)
	d.render(w, r, http.StatusOK, "workflowrun", page{Title: "Workflow run " + id, Nav: "workflows", Live: workflowTopic(id), Body: b})
}

// workflowActions reads the operator actions recorded on a run since it
// started, oldest first; none when EVENTS does not answer (the page shows
// the run anyway).
func (d *Dashboard) workflowActions(ctx context.Context, runID string, started time.Time) []workflowAction {
	info, err := jsInfo(ctx, d.js, protocol.StreamEvents)
	if err != nil {
		return nil
	}
	first := info.FirstSeq
	if seq, err := protocol.FirstSeqAt(ctx, d.nc, protocol.StreamEvents, started.Add(-time.Minute)); err == nil && seq > first {
		first = seq
	}
	msgs, _, _, err := protocol.BackwardScan{Stream: protocol.StreamEvents, Filter: protocol.AuditWorkflowSubject(runID),
		First: first, Last: info.LastSeq, Want: 50}.Run(ctx, d.nc)
	if err != nil {
		return nil
	}
	var out []workflowAction
	for i := len(msgs) - 1; i >= 0; i-- {
		var a protocol.Audit
		if json.Unmarshal(msgs[i].Data, &a) != nil {
			continue
		}
		out = append(out, workflowAction{Time: a.Time, Action: a.Action, Actor: a.Actor, Outcome: a.Outcome, Error: a.Error, Detail: a.Detail})
	}
	return out
}

// compactJSON writes a JSON value on one line (as is when it is not JSON).
func compactJSON(raw json.RawMessage) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return string(raw)
	}
	return string(out)
}

// workflowRunAction runs again the failed work of an ended run (retry-failed)
// or cancels a running run, records who did it beside the run, and goes
// back to the run's page.
func (d *Dashboard) workflowRunAction(w http.ResponseWriter, r *http.Request) {
	if !d.mayAct(w, r) {
		return
	}
	action := r.PathValue("action")
	if action != "retry-failed" && action != "cancel" {
		d.fail(w, r, http.StatusNotFound, "No workflow action "+shorten(action, 64))
		return
	}
	runID := r.PostFormValue("run_id")
	if err := protocol.ValidateWorkflowName("run id", runID); err != nil {
		d.fail(w, r, http.StatusBadRequest, "run_id: "+err.Error())
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	audit := protocol.Audit{Action: action, Detail: "workflow run " + runID}
	var run *jetfleet.WorkflowRunDetail
	var err error
	var msg string
	switch action {
	case "retry-failed":
		run, err = d.client.RetryFailedWorkflowRun(ctx, runID)
		if err == nil {
			msg = fmt.Sprintf("Run %s: its failed work runs again (round %d).", runID, run.Round)
			audit.Detail += fmt.Sprintf(" of workflow %s: round %d", run.Workflow, run.Round)
		}
	case "cancel":
		run, err = d.client.CancelWorkflowRun(ctx, runID)
		if err == nil {
			msg = fmt.Sprintf("Run %s cancelled.", runID)
			audit.Detail += " of workflow " + run.Workflow
		}
	}
	d.record(r, protocol.AuditWorkflowSubject(runID), audit, err)
	if err != nil {
		flash(w, action+" of run "+runID+" failed: "+err.Error(), true)
	} else {
		flash(w, msg, false)
	}
	back(w, r, "/workflows/runs/"+url.PathEscape(runID))
}
