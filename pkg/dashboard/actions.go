package dashboard

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// scheduleAction pauses (with a note), resumes, triggers or backfills a
// schedule, records who did it in the schedule's timeline, and goes back.
func (d *Dashboard) scheduleAction(w http.ResponseWriter, r *http.Request) {
	if !d.mayAct(w, r) {
		return
	}
	action := r.PathValue("action")
	id := r.PostFormValue("id")
	if err := protocol.ValidateToken("schedule id", id); err != nil {
		d.fail(w, r, http.StatusBadRequest, "id: "+err.Error())
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	audit := protocol.Audit{Action: action, ScheduleID: id}
	var msg string
	var err error
	switch action {
	case "pause":
		note := strings.TrimSpace(r.PostFormValue("note"))
		if len(note) > 500 {
			d.fail(w, r, http.StatusBadRequest, "note: at most 500 characters")
			return
		}
		if note == "" {
			note = "paused from the dashboard"
		}
		audit.Detail = note
		_, err = d.client.PauseSchedule(ctx, id, note+" ("+actor(principalOf(r.Context()), r)+")")
		msg = "Schedule " + id + " paused."
	case "resume":
		_, err = d.client.ResumeSchedule(ctx, id)
		msg = "Schedule " + id + " resumed: it fires from now on."
	case "trigger":
		res, terr := d.client.TriggerSchedule(ctx, id)
		err = terr
		if err == nil {
			audit.JobID = res.JobID
			audit.Detail = res.Outcome
			msg = fmt.Sprintf("Schedule %s triggered: %s", id, res.Outcome)
			if res.JobID != "" {
				msg += ", job " + res.JobID
			}
			if res.Reason != "" {
				msg += " (" + res.Reason + ")"
			}
			msg += "."
		}
	case "backfill":
		now := d.now()
		from, ferr := parseTime(r.PostFormValue("from"), now)
		to, terr := parseTime(r.PostFormValue("to"), now)
		switch {
		case ferr != nil || from.IsZero():
			d.fail(w, r, http.StatusBadRequest, "from: a time is required (RFC 3339 or 2006-01-02T15:04, UTC)")
			return
		case terr != nil || to.IsZero():
			d.fail(w, r, http.StatusBadRequest, "to: a time is required (RFC 3339 or 2006-01-02T15:04, UTC)")
			return
		case to.Before(from):
			d.fail(w, r, http.StatusBadRequest, "to: is before from")
			return
		}
		to = minTime(to, now)
		audit.Detail = fmt.Sprintf("from %s to %s", from.UTC().Format(time.RFC3339), to.UTC().Format(time.RFC3339))
		res, berr := d.client.BackfillSchedule(ctx, id, from, to, 0)
		err = berr
		if err == nil {
			msg = fmt.Sprintf("Backfill of %s fired %d run(s), %d already fired before", id, res.Fired, res.Duplicates)
			if res.Truncated {
				msg += "; truncated at the scheduler's max_backfill"
			}
			msg += "."
			audit.Detail += ": " + msg
		}
	default:
		d.fail(w, r, http.StatusNotFound, "No schedule action "+action)
		return
	}
	d.record(r, protocol.AuditScheduleSubject(id), audit, err)
	if err != nil {
		flash(w, action+" of "+id+" failed: "+err.Error(), true)
	} else {
		flash(w, msg, false)
	}
	back(w, r, "/schedules/"+id)
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
