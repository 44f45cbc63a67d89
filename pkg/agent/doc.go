// Package agent is the Go SDK of jetfleet agents: register a Handler per job
// kind, start an Agent, and it pulls jobs from JetStream, runs them with
// timeouts, retries and heartbeats, and records every step.
//
// # Getting started
//
// New makes an agent on a NATS connection, for the queues of its Config;
// options add a logger, telemetry and the fleet's topology settings. A
// handler is registered per job kind: AddHandler takes the kind from the
// job's args type (jetfleet.Args, which jetfleet.Client.Enqueue takes) and
// decodes each payload into it; Register takes a plain Handler and a kind
// name. Start begins pulling; Stop drains gracefully: it stops pulling,
// lets running jobs finish within its context, hands the rest back for
// immediate redelivery elsewhere, and waits for every outcome to be stored.
// The examples of package jetfleet run an agent end to end.
//
// Delivery is at least once: make side effects idempotent with
// Job.IdempotencyKey, the same on every delivery of the job's message
// (docs/agent.md explains when a job runs twice).
//
// # Outcomes
//
// What a handler returns decides what happens to the job, in exactly one
// place (decide in outcome.go; settle in execution.go carries it out):
//
//	nil                       → +ACK, confirmed by the server; status succeeded
//	Snooze(d)                 → NAK with delay d; no attempt spent; status snoozed
//	Retry(err, d)             → like any error, but the next attempt waits d
//	any other error           → NAK with the retry policy's backoff while attempts
//	                            remain; status retrying. On the last attempt:
//	                            dead letter (reason max_attempts), then TERM
//	NonRetryable(err), or an
//	error matched by the kind's RetryPolicy.NonRetryable
//	                          → dead letter (reason non_retryable), then TERM
//	Cancel(err)               → dead letter (reason cancelled), then TERM
//	a cancel (jetfleet jobs
//	cancel; the handler's
//	context ends)             → status cancelled, then TERM; no dead letter
//	Malformed(err)            → dead letter (reason malformed_payload), then TERM
//	panic                     → recovered into a *PanicError carrying the stack,
//	                            handled like any error
//	timeout                   → *TimeoutError, handled like any error
//
// Errors are matched with errors.Is and errors.As, never by their text; each
// outcome carries a stable code (protocol.Code*) into events and dead
// letters. A job's status is its latest event (docs/protocol.md §3.3).
//
// # Long jobs
//
// While a handler runs, the agent tells JetStream the job is in progress
// every AckWait/3, so a job may run far longer than AckWait. Progress(ctx)
// sends one at once.
//
// # Middleware
//
// Middleware is func(Handler) Handler. The agent runs every job through
// Tracing, Logging and Metrics (around the whole execution, including the
// ack), then Timeout, the configured middleware, and Recover around the
// handler.
package agent
