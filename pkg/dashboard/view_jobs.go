package dashboard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

type jobListBody struct {
	Filter  filter
	State   string
	Jobs    []jetfleet.JobListEntry
	Next    uint64
	Scanned int
}

func (d *Dashboard) jobList(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query(), d.now(), 1000, "state", "queue", "kind", "schedule", "since", "until", "cursor", "limit")
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	if f.State == "" {
		f.State = jetfleet.JobRunning
	}
	limit := f.Limit
	if limit == 0 {
		limit = d.cfg.PageSize
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	res, err := d.client.ListJobs(ctx, jetfleet.JobListRequest{State: f.State, Queue: f.Queue, Kind: f.Kind, ScheduleID: f.ScheduleID,
		Since: f.Since, Until: f.Until, Cursor: f.Cursor, Limit: limit})
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	b := &jobListBody{Filter: f, State: f.State, Jobs: res.Jobs, Next: res.Next, Scanned: res.Scanned}
	d.render(w, r, http.StatusOK, "jobs", page{Title: "Jobs: " + f.State, Nav: "jobs", Live: "jobs", Query: f.values(), Body: b})
}

// lookup sends the job id typed in the header's form to its page.
func (d *Dashboard) lookup(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimSpace(r.URL.Query().Get("id"))
	if err := protocol.ValidateJobID(id); err != nil {
		d.fail(w, r, http.StatusBadRequest, "Malformed job id: "+err.Error())
		return
	}
	http.Redirect(w, r, "/jobs/"+url.PathEscape(id), http.StatusSeeOther)
}

// eventRow is one line of a job's timeline.
type eventRow struct {
	Time     time.Time
	Type     string
	Attempt  uint32
	Max      uint32
	AgentID  string
	Duration time.Duration
	RetryIn  time.Duration
	Error    string
	Code     string
	Reason   string
	Seq      uint64
	Delivery uint64
	// ShowError: the error differs from the previous event's.
	ShowError bool
	// Action is set for an operator action.
	Action  bool
	Actor   string
	Outcome string
}

type jobBody struct {
	JobID   string
	Latest  *jetfleetpb.JobEvent
	State   string
	Queue   string
	Kind    string
	Events  []eventRow
	Running []jetfleet.RunningJob
	// The message, from JOBS (still there) or from its dead letter.
	Payload    *payloadView
	Result     *payloadView // what the handler returned (docs/protocol.md §3.10)
	Headers    map[string][]string
	Source     string
	DLQ        *jetfleet.DeadLetterEntry
	OutputTail string
	LastError  string
	TraceID    string
	JaegerUI   string
	Trace      *waterfall
	TraceError string
	ScheduleID string
}

func (d *Dashboard) jobDetail(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := protocol.ValidateJobID(id); err != nil {
		d.fail(w, r, http.StatusNotFound, "No job "+id+": "+err.Error())
		return
	}
	if _, err := parseFilter(r.URL.Query(), d.now(), 0); err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	b, err := d.jobData(ctx, id)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "job", page{Title: "Job " + id, Nav: "jobs", Live: "job:" + id, Body: b})
}

func (d *Dashboard) jobData(ctx context.Context, id string) (*jobBody, error) {
	timeline, err := d.client.JobTimeline(ctx, id, 1000)
	if err != nil {
		return nil, err
	}
	b := &jobBody{JobID: id, JaegerUI: d.cfg.Jaeger.UIURL}
	var seq uint64
	for _, t := range timeline {
		if a := t.Audit; a != nil {
			b.Events = append(b.Events, eventRow{Time: a.Time, Type: a.Action, Action: true, Actor: a.Actor, Outcome: a.Outcome,
				Error: a.Error, Reason: a.Detail, Seq: t.Sequence})
			continue
		}
		ev := t.Job
		if ev == nil {
			continue
		}
		b.Latest = ev
		row := eventRow{Time: asTime(ev.GetTime()), Type: ev.GetType(), Attempt: ev.GetAttempt(), Max: ev.GetMaxAttempts(),
			AgentID: ev.GetAgentId(), Duration: ev.GetDuration().AsDuration(), RetryIn: ev.GetRetryIn().AsDuration(),
			Error: ev.GetError(), Code: ev.GetErrorCode(), Reason: ev.GetReason(), Seq: t.Sequence, Delivery: ev.GetDelivered()}
		b.Events = append(b.Events, row)
		if ev.GetOutputTail() != "" {
			b.OutputTail = ev.GetOutputTail()
		}
		if ev.GetError() != "" {
			b.LastError = ev.GetError()
		}
		if ev.GetTraceId() != "" {
			b.TraceID = ev.GetTraceId()
		}
		if ev.GetScheduleId() != "" {
			b.ScheduleID = ev.GetScheduleId()
		}
		if ev.GetStreamSequence() != 0 {
			seq = ev.GetStreamSequence()
		}
	}
	sort.SliceStable(b.Events, func(i, j int) bool { return b.Events[i].Seq < b.Events[j].Seq })
	prevErr := ""
	for i := range b.Events {
		if e := &b.Events[i]; !e.Action {
			e.ShowError = e.Error != "" && e.Error != prevErr
			prevErr = e.Error
		}
	}
	detail, err := d.client.JobDetail(ctx, jetfleet.JobDetailRequest{JobID: id})
	switch {
	case err == nil:
		b.Running = detail.Running
	case protocol.IsCode(err, protocol.CodeNotFound):
	default:
		return nil, err
	}
	if b.Latest == nil && len(b.Running) == 0 {
		return nil, protocol.Errorf(protocol.CodeNotFound,
			"No event of job %s: no agent has taken it yet (see the queued jobs), or there is no such job.", id)
	}
	if b.Latest != nil {
		b.State, b.Queue, b.Kind = b.Latest.GetType(), b.Latest.GetQueue(), b.Latest.GetKind()
		if r := jetfleet.ResultOfEvent(b.Latest); r != nil {
			v := decodePayload(r)
			b.Result = &v
		}
	}
	if len(b.Running) > 0 {
		b.State, b.Queue, b.Kind = "running", b.Running[0].Queue, b.Running[0].Kind
		if b.Latest.GetType() == protocol.EventWaiting {
			b.State = protocol.EventWaiting // held by its agent until its kind's fleet-wide limit lets it start
		}
		if seq == 0 {
			seq = b.Running[0].StreamSequence
		}
	}
	// The message: still in JOBS, or in its dead letter.
	if seq != 0 {
		if msgs, err := protocol.DirectGetBatch(ctx, d.nc, protocol.StreamJobs, protocol.DirectGetRequest{Seq: seq, Batch: 1}); err == nil &&
			len(msgs) == 1 && msgs[0].Sequence == seq {
			p := decodePayload(msgs[0].Data)
			b.Payload, b.Headers, b.Source = &p, jobHeaders(msgs[0].Header), "JOBS message "+uintStr(seq)
		}
	}
	if b.Payload == nil {
		if letters, err := d.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{DLQFilter: jetfleet.DLQFilter{JobID: id}, Limit: 1000}); err == nil &&
			len(letters.Letters) > 0 {
			last := letters.Letters[len(letters.Letters)-1]
			if e, err := d.client.DeadLetter(ctx, last.Sequence); err == nil {
				b.DLQ = e
				if dl, err := e.Decode(); err == nil {
					p := decodePayload(dl.GetPayload())
					b.Payload, b.Headers, b.Source = &p, letterHeaders(dl), "dead letter "+uintStr(last.Sequence)
					if b.OutputTail == "" {
						b.OutputTail = dl.GetOutputTail()
					}
				}
			}
		}
	}
	if b.TraceID != "" && d.cfg.Jaeger.QueryURL != "" {
		b.Trace, err = d.fetchTrace(ctx, b.TraceID)
		if err != nil {
			b.TraceError = err.Error()
		}
	}
	return b, nil
}

func uintStr(v uint64) string { return strconvU(v) }

// jobHeaders are a message's headers without the server's own.
func jobHeaders(h nats.Header) map[string][]string {
	out := map[string][]string{}
	for k, v := range h {
		switch k {
		case "Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending", "Nats-Last-Sequence", "Nats-UpTo-Sequence":
			continue
		}
		out[k] = v
	}
	return out
}

func letterHeaders(dl *jetfleetpb.DeadLetter) map[string][]string {
	out := map[string][]string{}
	for k, v := range dl.GetHeaders() {
		out[k] = v.GetValues()
	}
	return out
}

// cancelAction cancels a job wherever it is (the supervisor's cancel: a
// running job's agent ends it, a queued or retrying one is removed).
func (d *Dashboard) cancelAction(w http.ResponseWriter, r *http.Request) {
	if !d.mayAct(w, r) {
		return
	}
	jobID := r.PostFormValue("job_id")
	if err := protocol.ValidateJobID(jobID); err != nil {
		d.fail(w, r, http.StatusBadRequest, "job_id: "+err.Error())
		return
	}
	who := actor(principalOf(r.Context()), r)
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	res, err := d.client.Cancel(ctx, jobID, jetfleet.CancelReason("cancelled from the dashboard by "+who), jetfleet.CancelRequestedBy(who))
	detail := ""
	if err == nil {
		detail = res.Where
		if res.AgentID != "" {
			detail += " on agent " + res.AgentID
		}
		if res.Error != "" {
			err = errors.New(res.Error)
		}
	}
	d.record(r, protocol.AuditJobSubject(jobID), protocol.Audit{Action: "cancel", JobID: jobID, Detail: detail}, err)
	if err != nil {
		flash(w, "Cancel of job "+jobID+" failed: "+err.Error(), true)
	} else {
		flash(w, "Job "+jobID+" cancelled ("+detail+").", false)
	}
	back(w, r, "/jobs/"+url.PathEscape(jobID))
}

// mayAct checks the role and the CSRF token of an action; false when it
// answered already.
func (d *Dashboard) mayAct(w http.ResponseWriter, r *http.Request) bool {
	p := principalOf(r.Context())
	if !p.CanAct() {
		d.fail(w, r, http.StatusForbidden, "Your role ("+p.Role+") may read but not act: actions need the operator role.")
		return false
	}
	if err := checkCSRF(r); err != nil {
		d.fail(w, r, http.StatusForbidden, err.Error())
		return false
	}
	return true
}
