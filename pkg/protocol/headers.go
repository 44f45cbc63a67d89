package protocol

// Job message headers. NATS headers are case-sensitive: write them exactly so.
const (
	// HeaderMsgID is JetStream's idempotency key: a second message with the
	// same id inside the stream's duplicate window is dropped.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderJobID is the job's identity. Falls back to Nats-Msg-Id, then to
	// "JOBS-<stream sequence>".
	HeaderJobID = "Jetfleet-Job-Id"
	// HeaderTimeout bounds one attempt, as a duration such as "30s" or "1m30s".
	HeaderTimeout = "Jetfleet-Timeout"
	// HeaderMaxAttempts is the number of attempts before the job is dead-lettered.
	HeaderMaxAttempts = "Jetfleet-Max-Attempts"
	// HeaderBackoff lists the delays before retries, comma-separated durations
	// ("1s,10s,1m"); the last one repeats.
	HeaderBackoff = "Jetfleet-Backoff"
	// HeaderScheduleID names the schedule that fired the job.
	HeaderScheduleID = "Jetfleet-Schedule-Id"
	// HeaderNominalTime is the schedule's nominal fire time, RFC 3339.
	HeaderNominalTime = "Jetfleet-Nominal-Time"
	// HeaderReplayedFrom marks a job republished from the dead-letter stream:
	// "DLQ:<sequence>".
	HeaderReplayedFrom = "Jetfleet-Replayed-From"
	// HeaderProcessAt delays a job until an RFC 3339 time: on a job
	// published to jobs.<queue>.<kind>, the agent that receives it before
	// then moves it to DELAYED (docs/protocol.md §2.2).
	HeaderProcessAt = "Jetfleet-Process-At"
	// HeaderUniqueKey names the claim in bucket unique that the job holds
	// (its UniqueClaimKey, docs/protocol.md §2.5). Informational: the claim
	// is released through the job's entry UniqueJobKey.
	HeaderUniqueKey = "Jetfleet-Unique-Key"
	// HeaderTraceParent and HeaderTraceState carry W3C trace context, lowercase.
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// Dead-letter message headers (besides Nats-Msg-Id), so tools can filter
// without decoding the body.
const (
	HeaderDeadReason = "Jetfleet-Dead-Reason"
)

// JetStream's message schedule headers (server 2.12+): a message on a
// schedule subject with Nats-Schedule "@at <RFC 3339 time>" is published
// once, then, on Nats-Schedule-Target, with Nats-Scheduler naming its
// schedule subject (and Nats-Msg-Id dropped).
const (
	HeaderNatsSchedule       = "Nats-Schedule"
	HeaderNatsScheduleTarget = "Nats-Schedule-Target"
	HeaderNatsScheduleTTL    = "Nats-Schedule-TTL"
	HeaderNatsScheduler      = "Nats-Scheduler"
)

// Headers JetStream adds to messages returned by direct get and message get.
const (
	HeaderNatsStream    = "Nats-Stream"
	HeaderNatsSubject   = "Nats-Subject"
	HeaderNatsSequence  = "Nats-Sequence"
	HeaderNatsTimeStamp = "Nats-Time-Stamp"
)
