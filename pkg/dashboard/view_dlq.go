package dashboard

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

type dlqListBody struct {
	Filter   filter
	Letters  []jetfleet.DeadLetterEntry
	Next     uint64
	Filtered bool
}

func (d *Dashboard) dlqFilter(r *http.Request) (filter, error) {
	return parseFilter(r.URL.Query(), d.now(), 1000, "queue", "kind", "reason", "job", "since", "until", "cursor", "limit")
}

func (f filter) dlq() jetfleet.DLQFilter {
	return jetfleet.DLQFilter{Queue: f.Queue, Kind: f.Kind, Reason: f.Reason, JobID: f.JobID, Since: f.Since, Until: f.Until}
}

func (d *Dashboard) dlqList(w http.ResponseWriter, r *http.Request) {
	f, err := d.dlqFilter(r)
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
	res, err := d.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{DLQFilter: f.dlq(), After: f.Cursor, Limit: limit})
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	b := &dlqListBody{Filter: f, Letters: res.Letters, Next: res.Next, Filtered: !f.dlq().Empty()}
	d.render(w, r, http.StatusOK, "dlq", page{Title: "Dead letters", Nav: "dlq", Live: "dlq", Query: f.values(), Body: b})
}

type dlqBody struct {
	Entry   *jetfleet.DeadLetterEntry
	Payload payloadView
	Headers map[string][]string
	Error   string
	Output  string
	TraceID string
	Failed  time.Time
}

func (d *Dashboard) dlqDetail(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		d.fail(w, r, http.StatusNotFound, fmt.Sprintf("No dead letter %q: a dead letter's id is its sequence number in the DLQ stream.", r.PathValue("seq")))
		return
	}
	if _, err := parseFilter(r.URL.Query(), d.now(), 0); err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	e, err := d.client.DeadLetter(ctx, seq)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	dl, err := e.Decode()
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	b := &dlqBody{Entry: e, Payload: decodePayload(dl.GetPayload()), Headers: letterHeaders(dl), Error: dl.GetLastError(),
		Output: dl.GetOutputTail(), TraceID: dl.GetTraceId(), Failed: asTime(dl.GetFailedAt())}
	d.render(w, r, http.StatusOK, "dlqletter", page{Title: fmt.Sprintf("Dead letter %d", seq), Nav: "dlq", Live: "dlq", Body: b})
}

// dlqAction replays or purges one letter (sequence) or the letters of a
// filter (the list's filter, sent with the form).
func (d *Dashboard) dlqAction(w http.ResponseWriter, r *http.Request) {
	if !d.mayAct(w, r) {
		return
	}
	action := r.PathValue("action")
	if action != "replay" && action != "purge" {
		d.fail(w, r, http.StatusNotFound, "No dead-letter action "+action)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	var seq uint64
	if v := r.PostFormValue("sequence"); v != "" {
		var err error
		if seq, err = strconv.ParseUint(v, 10, 64); err != nil || seq == 0 {
			d.fail(w, r, http.StatusBadRequest, "sequence: must be a dead letter's sequence")
			return
		}
	}
	var f filter
	if seq == 0 {
		var err error
		q := r.PostForm
		fq := map[string][]string{}
		for _, k := range []string{"queue", "kind", "reason", "job", "since", "until"} {
			if v := q.Get(k); v != "" {
				fq[k] = []string{v}
			}
		}
		if f, err = parseFilter(fq, d.now(), 0, "queue", "kind", "reason", "job", "since", "until"); err != nil {
			d.failErr(w, r, err)
			return
		}
		if f.dlq().Empty() && r.PostFormValue("all") != "yes" {
			d.fail(w, r, http.StatusBadRequest, "A bulk "+action+" needs a filter, or confirmation that it is for all dead letters.")
			return
		}
	}
	audit := protocol.Audit{Action: action, DLQSequence: seq}
	subject := protocol.AuditDLQSubject
	var msg string
	var err error
	if seq > 0 {
		var entry *jetfleet.DeadLetterEntry
		if entry, err = d.client.DeadLetter(ctx, seq); err == nil {
			audit.JobID, audit.Queue, audit.Kind = entry.JobID, entry.Queue, entry.Kind
			subject = protocol.AuditJobSubject(entry.JobID)
		}
	} else {
		audit.Detail = "filter " + f.values().Encode()
		if audit.Detail == "filter " {
			audit.Detail = "all dead letters"
		}
	}
	if err == nil {
		switch action {
		case "replay":
			var res *jetfleet.ReplayResponse
			res, err = d.client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{Sequence: seq, DLQFilter: f.dlq(), All: seq == 0 && f.dlq().Empty(),
				Force: r.PostFormValue("force") == "yes"})
			if err == nil {
				n, failed := 0, 0
				for _, x := range res.Results {
					if x.Error != "" {
						failed++
					} else if !x.AlreadyReplayed {
						n++
					}
				}
				msg = fmt.Sprintf("Replayed %d dead letter(s)", n)
				if res.AlreadyReplayed > 0 || (seq > 0 && n == 0 && failed == 0) {
					msg += fmt.Sprintf("; %d replayed before (tick force to replay again)", max(res.AlreadyReplayed, 1-n))
				}
				if failed > 0 {
					msg += fmt.Sprintf("; %d failed", failed)
				}
				if res.Truncated {
					msg += "; more match: replay again to go on"
				}
				audit.Detail += " " + msg
			}
		case "purge":
			var res *jetfleet.PurgeResponse
			res, err = d.client.PurgeDeadLetters(ctx, jetfleet.PurgeRequest{Sequence: seq, DLQFilter: f.dlq(), All: seq == 0 && f.dlq().Empty()})
			if err == nil {
				msg = fmt.Sprintf("Purged %d dead letter(s)", res.Purged)
			}
		}
	}
	d.record(r, subject, audit, err)
	if err != nil {
		flash(w, action+" failed: "+err.Error(), true)
	} else {
		flash(w, msg+".", false)
	}
	fallback := "/dlq"
	if seq > 0 && action == "replay" {
		fallback = fmt.Sprintf("/dlq/%d", seq)
	}
	back(w, r, fallback)
}
