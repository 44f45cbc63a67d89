package protocol

// Names the supervisor adds to the contract (docs/protocol.md §7).

// StreamSupervisor holds the supervisor's own records on SupervisorSubjects:
// execution history per job kind and per schedule, replay markers, alert
// incidents and circuit-breaker states. The supervisor provisions it.
const StreamSupervisor = "SUPERVISOR"

// SupervisorSubjects is the subject space of StreamSupervisor.
const SupervisorSubjects = "jetfleet.supervisor.>"

// HistoryKindSubject keeps the last executions of kind in queue.
func HistoryKindSubject(queue, kind string) string {
	return "jetfleet.supervisor.history.kind." + queue + "." + kind
}

// HistoryScheduleSubject keeps the last executions of a schedule.
func HistoryScheduleSubject(scheduleID string) string {
	return "jetfleet.supervisor.history.schedule." + scheduleID
}

// QueueEventsSubjects matches every queue event (QueueEvent documents).
const QueueEventsSubjects = "events.queue.>"

// QueueEventSubject is where an event about a queue is published.
func QueueEventSubject(queue, eventType string) string {
	return "events.queue." + queue + "." + eventType
}

// Queue event types (QueueEvent.type).
const (
	// EventBreakerOpened: the queue's consumer was paused by its circuit breaker.
	EventBreakerOpened = "breaker_opened"
	// EventBreakerClosed: the queue's consumer was resumed after the cool-down.
	EventBreakerClosed = "breaker_closed"
)

// Alert severities (Alert.severity), also the last token of AlertSubject.
const (
	SeverityInfo     = "info"
	SeverityWarning  = "warning"
	SeverityCritical = "critical"
)

// Headers of a compensating job, published by the supervisor when a job of
// a kind with a compensation policy fails for good.
const (
	// HeaderCompensates is the id of the failed job a compensating job undoes.
	HeaderCompensates = "Jetfleet-Compensates"
	// HeaderWorkflowRun and HeaderWorkflowStep name the run and the step of
	// a workflow step's job (informative: the job id says the same).
	HeaderWorkflowRun  = "Jetfleet-Workflow-Run"
	HeaderWorkflowStep = "Jetfleet-Workflow-Step"
	// HeaderRunID names the run a message on workflows.<name> starts.
	HeaderRunID = "Jetfleet-Run-Id"
	// HeaderDeadLetter points at the failed job's dead letter: "DLQ:<sequence>".
	HeaderDeadLetter = "Jetfleet-Dead-Letter"
)
