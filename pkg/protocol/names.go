package protocol

import (
	"fmt"
	"strconv"
	"strings"
)

// Streams.
const (
	// StreamJobs holds job messages (work-queue retention) on JobsSubjects.
	StreamJobs = "JOBS"
	// StreamDLQ holds dead letters on DLQSubjects.
	StreamDLQ = "DLQ"
	// StreamEvents holds job and schedule events on EventsSubjects.
	StreamEvents = "EVENTS"
	// StreamAdvisories captures the JetStream advisories the supervisor acts on.
	StreamAdvisories = "ADVISORIES"
	// StreamDelayed holds delayed jobs: a JetStream message schedule each,
	// on DelayedSubject, which fires the job on DueSubject when it is due;
	// JOBS sources the due jobs onto jobs.<queue>.<kind>.
	StreamDelayed = "DELAYED"
	// StreamWorkflows holds the messages that start workflow runs
	// (work-queue retention), on WorkflowsSubjects: the supervisor leader
	// takes each one (docs/protocol.md §8.2).
	StreamWorkflows = "WORKFLOWS"
)

// WorkflowsSubjects are the subjects of StreamWorkflows:
// workflows.<workflow name>, whose body is the run's input.
const WorkflowsSubjects = "workflows.>"

// WorkflowStartSubject is where a message starts a run of workflow.
func WorkflowStartSubject(workflow string) string { return "workflows." + workflow }

// WorkflowJobQueue is the queue token of the job events a run reports for
// the job id it was started as (a schedule's fire, a message with
// Jetfleet-Job-Id): events.job._workflows.<workflow>.<type>.<job token>.
const WorkflowJobQueue = "_workflows"

// DelayedConsumer is a consumer of DELAYED that is never read: its count of
// pending messages is the count of delayed jobs.
const DelayedConsumer = "delayed"

// DelayedDueTTL is how long a due job waits in DELAYED for JOBS to take it
// (JOBS sources it at once unless JOBS refuses messages, full).
const DelayedDueTTL = "24h"

// Key-value buckets.
const (
	BucketSchedules     = "schedules"
	BucketScheduleState = "schedule_state"
	BucketLeases        = "leases"
	BucketAgents        = "agents"
	// BucketCancels holds the cancels requested for jobs that were not
	// running (JobCancel documents, key: the job token); agents check it
	// before they run a job.
	BucketCancels = "cancels"
	// BucketLimits holds the fleet-wide limits per kind (KindLimit
	// documents), the concurrency slots taken and the rate's next start
	// (docs/protocol.md §2.4).
	BucketLimits = "limits"
	// BucketUnique holds the claims of unique jobs and, per job that holds
	// one, where it is (docs/protocol.md §2.5; unique.go).
	BucketUnique = "unique"
	// BucketWorkflows holds the workflow definitions (key: the workflow's
	// name) and BucketWorkflowRuns the state of every run (key: the run id),
	// which the supervisor leader advances (docs/workflows.md).
	BucketWorkflows    = "workflows"
	BucketWorkflowRuns = "workflow_runs"
)

// Subject roots and wildcards.
const (
	JobsSubjects = "jobs.>"
	// DelayedSubjects and DueSubjects are the subjects of DELAYED: the
	// delayed jobs (delayed.<queue>.<kind>.<job token>), and the jobs their
	// schedules fire (due.<queue>.<kind>).
	DelayedSubjects = "delayed.>"
	DueSubjects     = "due.>"
	DLQSubjects     = "dlq.>"
	EventsSubjects  = "events.>"
	// JobEventsSubjects matches every job event.
	JobEventsSubjects = "events.job.>"
	// ScheduleEventsSubjects matches every schedule event.
	ScheduleEventsSubjects = "events.schedule.>"
	// HeartbeatsSubjects matches the heartbeats of every agent.
	HeartbeatsSubjects = "jetfleet.agents.*.heartbeat"
	// AlertsSubjects matches every alert.
	AlertsSubjects = "jetfleet.alerts.>"
	// APISubjects is the root of the request/reply APIs of the services.
	APISubjects = "jetfleet.api.>"
)

// Advisories the ADVISORIES stream captures for the JOBS stream.
const (
	AdvisoryMaxDeliveriesSubjects = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + StreamJobs + ".>"
	AdvisoryTerminatedSubjects    = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + StreamJobs + ".>"
)

// ValidateToken reports whether s can be used as a queue name, job kind,
// agent id or schedule id: 1 to 128 of A-Z a-z 0-9 - _, one NATS subject
// token that is also a valid consumer name and key-value key, and readable
// in a shell. what names the concept in the error ("queue"). (A loop, not a
// regexp: it runs for every job an agent receives.)
func ValidateToken(what, s string) error {
	if len(s) == 0 || len(s) > 128 || !allTokenBytes(s, false) {
		return fmt.Errorf("invalid %s %q: use 1 to 128 letters, digits, '-' or '_'", what, s)
	}
	return nil
}

// QueueConsumer is the durable pull consumer that serves queue.
func QueueConsumer(queue string) string { return "queue-" + queue }

// JobSubject is the subject a job of kind is published on in queue.
func JobSubject(queue, kind string) string { return "jobs." + queue + "." + kind }

// DelayedSubject is the subject of the delayed job jobID of kind on queue,
// its message schedule: one per job id (a second one replaces it).
func DelayedSubject(queue, kind, jobID string) string {
	return "delayed." + queue + "." + kind + "." + JobToken(jobID)
}

// DelayedOfID matches the delayed job jobID, whatever its queue and kind.
func DelayedOfID(jobID string) string { return "delayed.*.*." + JobToken(jobID) }

// DelayedFilter matches the delayed jobs of queue and kind; an empty one
// matches any.
func DelayedFilter(queue, kind string) string {
	return "delayed." + cmpOr(queue, "*") + "." + cmpOr(kind, "*") + ".*"
}

func cmpOr(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// ParseDelayedSubject splits delayed.<queue>.<kind>.<job token>.
func ParseDelayedSubject(subject string) (queue, kind, jobToken string, err error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 || parts[0] != "delayed" {
		return "", "", "", fmt.Errorf("subject %q is not of the form delayed.<queue>.<kind>.<job token>", subject)
	}
	return parts[1], parts[2], parts[3], nil
}

// DueSubject is where the schedule of a delayed job of kind on queue at
// priority p fires it, in DELAYED; JOBS takes it from there onto
// JobSubjectAt(queue, kind, p).
func DueSubject(queue, kind, p string) string {
	if t := priorityToken(p); t != "" {
		return "due." + queue + "." + kind + "." + t
	}
	return "due." + queue + "." + kind
}

// QueueSubjects is the filter of queue's default-priority consumer:
// jobs.<queue>.<kind>, three tokens (priorities have a fourth).
func QueueSubjects(queue string) string { return "jobs." + queue + ".*" }

// QueueAllSubjects matches every job of queue, at every priority.
func QueueAllSubjects(queue string) string { return "jobs." + queue + ".>" }

// ParseJobSubject splits jobs.<queue>.<kind> — or
// jobs.<queue>.<kind>.<priority>, priority high or low (JobPriority) —
// into its queue and kind.
func ParseJobSubject(subject string) (queue, kind string, err error) {
	if strings.Count(subject, ".") == 3 {
		cut := strings.LastIndexByte(subject, '.')
		if p := subject[cut+1:]; p != PriorityHigh && p != PriorityLow {
			return "", "", fmt.Errorf("subject %q is not of the form jobs.<queue>.<kind>[.high|.low]", subject)
		}
		subject = subject[:cut]
	}
	return parseTwoTokenSubject("jobs", subject)
}

// DLQSubject is the subject of a dead letter of kind from queue.
func DLQSubject(queue, kind string) string { return "dlq." + queue + "." + kind }

// ParseDLQSubject splits dlq.<queue>.<kind> into its queue and kind.
func ParseDLQSubject(subject string) (queue, kind string, err error) {
	return parseTwoTokenSubject("dlq", subject)
}

// parseTwoTokenSubject splits <root>.<queue>.<kind> without allocating:
// every delivered job goes through it.
func parseTwoTokenSubject(root, subject string) (queue, kind string, err error) {
	rest, rooted := strings.CutPrefix(subject, root+".")
	queue, kind, split := strings.Cut(rest, ".")
	if !rooted || !split || strings.Contains(kind, ".") {
		return "", "", fmt.Errorf("subject %q is not of the form %s.<queue>.<kind>", subject, root)
	}
	if err := ValidateToken("queue", queue); err != nil {
		return "", "", err
	}
	if err := ValidateToken("kind", kind); err != nil {
		return "", "", err
	}
	return queue, kind, nil
}

// JobEventSubject is where an event of type eventType about a job is
// published: events.job.<queue>.<kind>.<type>.<job token>.
func JobEventSubject(queue, kind, eventType, jobID string) string {
	return "events.job." + queue + "." + kind + "." + eventType + "." + JobToken(jobID)
}

// JobEventMsgID is the Nats-Msg-Id of a job event about delivery delivered
// of the JOBS message at streamSeq, so that a resent event (its answer was
// lost) is stored once inside EVENTS' duplicate window: one id per event
// type and delivery, <type>:JOBS:<seq>:<delivered>; and one dead event per
// job message whoever writes it, agent or supervisor, dead:dlq:JOBS:<seq>
// (as its dead letter). It is empty without a stream sequence.
func JobEventMsgID(eventType string, streamSeq, delivered uint64) string {
	if streamSeq == 0 {
		return ""
	}
	if eventType == EventDead {
		return eventType + ":" + DeadLetterMsgID(StreamJobs, streamSeq)
	}
	return eventType + ":" + StreamJobs + ":" + strconv.FormatUint(streamSeq, 10) + ":" + strconv.FormatUint(delivered, 10)
}

// ProgressEventMsgID is the Nats-Msg-Id of the n-th progress event (n from
// 1) of delivery delivered of the JOBS message at streamSeq:
// progress:JOBS:<seq>:<delivered>:<n>. Each report of a delivery has an id
// of its own, so none is taken for a resend of another; a resend of the
// same report keeps its id and is stored once. Empty without a stream
// sequence.
func ProgressEventMsgID(streamSeq, delivered, n uint64) string {
	id := JobEventMsgID(EventProgress, streamSeq, delivered)
	if id == "" {
		return ""
	}
	return id + ":" + strconv.FormatUint(n, 10)
}

// EventSubject is a subject of EVENTS taken apart: a job event
// (events.job.<queue>.<kind>.<type>.<job token>), a schedule event
// (events.schedule.<schedule id>.<type>) or a queue event
// (events.queue.<queue>.<type>).
type EventSubject struct {
	// Of is "job", "schedule" or "queue".
	Of string
	// Queue and Kind of a job event; Queue of a queue event.
	Queue, Kind string
	// ScheduleID of a schedule event.
	ScheduleID string
	// Type is the event's type.
	Type string
	// JobToken is the last token of a job event: JobToken of the job id.
	JobToken string
}

// ParseEventSubject takes an EVENTS subject apart; ok is false for any
// other subject (an agent's batch commit, a subject of the wrong shape).
func ParseEventSubject(subject string) (ev EventSubject, ok bool) {
	parts := strings.Split(subject, ".")
	if len(parts) < 4 || parts[0] != "events" {
		return ev, false
	}
	switch {
	case parts[1] == "job" && len(parts) == 6:
		return EventSubject{Of: "job", Queue: parts[2], Kind: parts[3], Type: parts[4], JobToken: parts[5]}, true
	case parts[1] == "schedule" && len(parts) == 4:
		return EventSubject{Of: "schedule", ScheduleID: parts[2], Type: parts[3]}, true
	case parts[1] == "queue" && len(parts) == 4:
		return EventSubject{Of: "queue", Queue: parts[2], Type: parts[3]}, true
	}
	return ev, false
}

// EventBatchCommitSubject is where an agent ends a fast batch of its job
// events (JetStream's end-of-batch commit, which is not stored):
// events.batch.<agent id>. Readers of job events never see it.
func EventBatchCommitSubject(agentID string) string {
	return "events.batch." + agentID
}

// JobEventsOfJob matches every event of one job; the last message on it is
// the job's status.
func JobEventsOfJob(queue, kind, jobID string) string {
	return "events.job." + queue + "." + kind + ".*." + JobToken(jobID)
}

// JobEventsOfID matches every event of a job whose queue and kind are unknown.
func JobEventsOfID(jobID string) string {
	return "events.job.*.*.*." + JobToken(jobID)
}

// JobEventsOfType matches events of one type about jobs of kind in queue;
// "*" stands for any queue, kind or type.
func JobEventsOfType(queue, kind, eventType string) string {
	return "events.job." + queue + "." + kind + "." + eventType + ".*"
}

// ScheduleEventSubject is where an event about a schedule is published.
func ScheduleEventSubject(scheduleID, eventType string) string {
	return "events.schedule." + scheduleID + "." + eventType
}

// HeartbeatSubject is where agentID publishes its heartbeats.
func HeartbeatSubject(agentID string) string { return "jetfleet.agents." + agentID + ".heartbeat" }

// ControlSubject is where agentID listens for commands (AgentCommand documents).
func ControlSubject(agentID string) string { return "jetfleet.agents." + agentID + ".control" }

// ParseHeartbeatSubject returns the agent id of a heartbeat subject.
func ParseHeartbeatSubject(subject string) (string, error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 || parts[0] != "jetfleet" || parts[1] != "agents" || parts[3] != "heartbeat" {
		return "", fmt.Errorf("subject %q is not of the form jetfleet.agents.<agent_id>.heartbeat", subject)
	}
	return parts[2], ValidateToken("agent id", parts[2])
}

// AlertSubject is where alerts of severity are published.
func AlertSubject(severity string) string { return "jetfleet.alerts." + severity }
