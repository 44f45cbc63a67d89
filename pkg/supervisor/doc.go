// Package supervisor is the supervisor service of jetfleet: it makes
// failure boring. Every replica follows the agents' heartbeats and serves
// the API (dead letters, agents, running jobs, job status, execution
// history, fleet status); the replica holding the lease in bucket leases
// acts:
//
//   - liveness: an agent silent for missed_heartbeats of its intervals, with
//     no responder on its control subject (or no answer to a ping while the
//     supervisor's own connection answers), is dead; each job of its last
//     heartbeat that has not moved on is recorded rescued and NAKed on its
//     reply subject, so JetStream redelivers it at once instead of after
//     AckWait; so are the jobs of a process replaced by a restart;
//   - deadlines: an attempt past its timeout and deadline_grace, measured
//     on the supervisor's clock, gets a timeout command, and kill_grace
//     later is failed (NAK or dead letter) and recorded timed_out;
//     deliveries JetStream gave to another agent while a live one still
//     runs them are reported ack-overdue;
//   - max deliveries: advisories captured by stream ADVISORIES are consumed
//     durably and each dead-letters its job once (GetMsg → DLQ with
//     Nats-Msg-Id dlq:JOBS:<seq> → DeleteMsg → dead event), and a periodic
//     reconciliation finds messages past max_deliver no advisory covered;
//   - escalation: every dead letter is alerted on (NATS and webhooks, one
//     alert per incident per dedupe window) and compensated per its kind's
//     and schedule's policy; schedules failing N runs in a row are paused;
//     each queue's circuit breaker pauses its consumer when the failure rate
//     crosses a threshold and resumes it after a cool-down;
//   - history: every finished run becomes a compact Execution record in
//     stream SUPERVISOR, the last history_size per kind and per schedule.
//
// docs/supervision.md describes the whole service.
package supervisor
