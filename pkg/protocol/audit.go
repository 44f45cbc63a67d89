package protocol

import (
	"strconv"
	"time"
)

// Operator actions (the dashboard's pause, trigger, replay, cancel, …) are
// recorded as Audit documents in EVENTS, beside the events of what they act
// on, on subjects that no job or schedule event uses — so an action never
// becomes a job's latest event (its status):
//
//	events.audit.job.<job token>          an action on one job (cancel, replay of its dead letter)
//	events.audit.schedule.<schedule_id>   pause, resume, trigger, backfill
//	events.audit.dlq                      a bulk replay or purge of dead letters
//	events.audit.queue.<queue>            an action on a queue
//	events.audit.workflow.<run id>        retry-failed, cancel of a workflow run
const (
	// AuditSubjects matches every audit record.
	AuditSubjects = "events.audit.>"
)

// AuditJobSubject is where actions on a job are recorded.
func AuditJobSubject(jobID string) string { return "events.audit.job." + JobToken(jobID) }

// AuditScheduleSubject is where actions on a schedule are recorded.
func AuditScheduleSubject(scheduleID string) string { return "events.audit.schedule." + scheduleID }

// AuditDLQSubject is where bulk dead-letter actions are recorded.
const AuditDLQSubject = "events.audit.dlq"

// AuditQueueSubject is where actions on a queue are recorded.
func AuditQueueSubject(queue string) string { return "events.audit.queue." + queue }

// AuditWorkflowSubject is where actions on a workflow run are recorded (a
// run id is a token).
func AuditWorkflowSubject(runID string) string { return "events.audit.workflow." + runID }

// Audit records one operator action: who did what, to what, when, and how
// it ended. It is a JSON document (snake_case, like every document).
type Audit struct {
	// Type is always "action".
	Type string `json:"type"`
	// Action names it: pause, resume, trigger, backfill, replay, purge, cancel.
	Action string `json:"action"`
	// Actor is who acted: a user or token name, or anonymous@<address> on
	// a dashboard without credentials (loopback only); Role their role.
	Actor string `json:"actor"`
	Role  string `json:"role,omitempty"`
	// Source names the program that acted (dashboard, and its replica).
	Source string    `json:"source,omitempty"`
	Time   time.Time `json:"time"`
	// What it acted on; the fields that apply are set.
	JobID       string `json:"job_id,omitempty"`
	Queue       string `json:"queue,omitempty"`
	Kind        string `json:"kind,omitempty"`
	ScheduleID  string `json:"schedule_id,omitempty"`
	DLQSequence uint64 `json:"dlq_sequence,omitempty"`
	// Detail is the request in words (a note, a filter, a time range).
	Detail string `json:"detail,omitempty"`
	// Outcome is ok or failed; Error says why it failed.
	Outcome string `json:"outcome"`
	Error   string `json:"error,omitempty"`
}

// AuditType is the Type of every Audit document.
const AuditType = "action"

// Trends: the supervisor leader's time-bucketed rollups per job kind and
// per schedule (docs/supervision.md §12), in stream TRENDS, one message per
// bucket (the latest version of it), minute buckets expiring after
// supervisor.trends.minute_retention and hour buckets after
// supervisor.trends.hour_retention (per-message TTL):
//
//	jetfleet.trends.<m|h>.kind.<queue>.<kind>.<bucket start, Unix seconds>
//	jetfleet.trends.<m|h>.schedule.<schedule_id>.<bucket start>
//	jetfleet.trends.status.kind.<queue>.<kind>   the series' latest verdict (degrading or not)
//	jetfleet.trends.status.schedule.<schedule_id>
//
// A series that turns degrading or recovers publishes a TrendEvent on
// events.trend.kind.<queue>.<kind>.<degrading|recovered> or
// events.trend.schedule.<schedule_id>.<degrading|recovered>.
const (
	StreamTrends   = "TRENDS"
	TrendsSubjects = "jetfleet.trends.>"
	// TrendStatusSubjects matches every series' status.
	TrendStatusSubjects = "jetfleet.trends.status.>"
	// TrendEventsSubjects matches every trend event.
	TrendEventsSubjects = "events.trend.>"

	TrendMinute = "m"
	TrendHour   = "h"

	EventDegrading = "degrading"
	EventRecovered = "recovered"
)

// TrendSeries names a series: a kind in a queue, or a schedule.
func TrendSeries(queue, kind, scheduleID string) string {
	if scheduleID != "" {
		return "schedule." + scheduleID
	}
	return "kind." + queue + "." + kind
}

// TrendBucketSubject is the subject of one bucket of series at resolution res.
func TrendBucketSubject(res, series string, start time.Time) string {
	return "jetfleet.trends." + res + "." + series + "." + strconv.FormatInt(start.Unix(), 10)
}

// TrendBucketsOf matches every bucket of series at resolution res.
func TrendBucketsOf(res, series string) string { return "jetfleet.trends." + res + "." + series + ".*" }

// TrendStatusSubject is where a series' latest verdict is kept.
func TrendStatusSubject(series string) string { return "jetfleet.trends.status." + series }

// TrendEventSubject is where a series' change of verdict is published.
func TrendEventSubject(series, eventType string) string {
	return "events.trend." + series + "." + eventType
}

// AlertLogSubjects matches the alerts the supervisor keeps in stream
// SUPERVISOR (the last supervisor.history_size of each incident key), newest
// last: what the dashboard shows as recent alerts.
const AlertLogSubjects = "jetfleet.supervisor.alerts.>"

// AlertLogSubject is where the supervisor keeps the alerts of incident key.
func AlertLogSubject(key string) string { return "jetfleet.supervisor.alerts." + JobToken(key) }
