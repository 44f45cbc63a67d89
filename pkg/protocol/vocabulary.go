package protocol

// Job event types (JobEvent.type), also the last subject token of the event.
const (
	// EventStarted: an attempt began on an agent.
	EventStarted = "started"
	// EventProgress: the running attempt reported how far it got (progress,
	// progress_message). The job is still running; a started event precedes
	// the first of an attempt.
	EventProgress = "progress"
	// EventSucceeded: the handler returned success and the ack was confirmed.
	EventSucceeded = "succeeded"
	// EventRetrying: the attempt failed and the job will be redelivered after retry_in.
	EventRetrying = "retrying"
	// EventSnoozed: the handler asked to run again after retry_in without spending an attempt.
	EventSnoozed = "snoozed"
	// EventReleased: the agent handed the job back without spending an attempt,
	// because it is stopping or does not run the kind (reason says which).
	EventReleased = "released"
	// EventFailed: the attempt failed and no attempt follows; a dead letter follows.
	EventFailed = "failed"
	// EventCancelled: the job was cancelled on request (running, queued,
	// waiting for a retry or delayed); its run is over, without a dead letter.
	// A cancel that asks for a dead letter records failed and dead instead.
	EventCancelled = "cancelled"
	// EventDead: the job was written to the dead-letter stream.
	EventDead = "dead"
	// EventRescued: the supervisor released the job of a dead agent for redelivery.
	EventRescued = "rescued"
	// EventTimedOut: the supervisor found the job running past its deadline.
	EventTimedOut = "timed_out"
	// EventSkippedDuplicate: a redelivered job had already succeeded and was acked without running.
	EventSkippedDuplicate = "skipped_duplicate"
	// EventWaiting: the job waits on its agent for its kind's fleet-wide
	// limit (reason says which); no attempt is spent. A started event
	// follows when it may start.
	EventWaiting = "waiting"
)

// Schedule event types (ScheduleEvent.type).
const (
	EventFired   = "fired"
	EventSkipped = "skipped"
	EventMissed  = "missed"
	EventPaused  = "paused"
	EventResumed = "resumed"
	EventCreated = "created"
	EventUpdated = "updated"
	EventDeleted = "deleted"
)

// Dead-letter reasons (DeadLetter.reason).
const (
	ReasonMaxAttempts      = "max_attempts"
	ReasonNonRetryable     = "non_retryable"
	ReasonCancelled        = "cancelled"
	ReasonMaxDeliveries    = "max_deliveries"
	ReasonTerminated       = "terminated"
	ReasonTimedOut         = "timed_out"
	ReasonMalformedPayload = "malformed_payload"
	ReasonUnknownKind      = "unknown_kind"
	ReasonInvalidHeaders   = "invalid_headers"
	ReasonPayloadTooLarge  = "payload_too_large"
	// ReasonUnroutable: the job's queue has no consumer (JOBS accepted it,
	// nothing would ever deliver it).
	ReasonUnroutable = "unroutable"
	// ReasonInvalidSubject: the job's subject is not jobs.<queue>.<kind>
	// with valid tokens, and no queue consumer delivers it.
	ReasonInvalidSubject = "invalid_subject"
)

// Agent command actions (AgentCommand.action).
const (
	// CommandCancel ends the job as cancelled: dead-lettered, reason cancelled.
	CommandCancel = "cancel"
	// CommandTimeout ends the attempt as timed out (code timeout): retried
	// while attempts remain. The supervisor sends it for an attempt past its
	// deadline and the grace.
	CommandTimeout = "timeout"
	// CommandPing is the action the supervisor probes an agent with before
	// it declares it dead. Any reply, an error reply included, proves the
	// agent alive; agents answer it as a known action.
	CommandPing = "ping"
)
