// Package jetfleet is the Go client of a jetfleet fleet: it enqueues jobs,
// reads their status and waits for them, and calls the scheduler's and the
// supervisor's APIs — on one NATS connection. Agents, the side that runs
// jobs, are package agent. The examples (Example, the package example,
// first) are runnable: each starts a whole fleet in one process.
//
// # Jobs
//
// A job's arguments are a Go type whose Kind method names the job kind, a
// stable string: the <kind> of the job's subject jobs.<queue>.<kind> (Args).
// Client.Enqueue encodes the arguments as JSON, the job's payload, and
// returns once JetStream stored the job. Options set the queue (or the
// args' Queue method, QueueArgs; the default is "default"), the job id
// (WithJobID — also the idempotency key: the same id enqueued again within
// the duplicate window stores nothing and reports Duplicate), the timeout
// of an attempt, the attempts and the backoff; an args type may carry
// default options (DefaultOptionsArgs). The trace context of ctx travels
// with the job, so the agent's span continues the caller's trace.
// EnqueueMany publishes many jobs at once, with one result each.
//
// Job control: WithProcessAt and WithProcessIn delay a job (JetStream
// message schedules, docs/protocol.md §2.2), WithPriority runs it before or
// after the queue's default jobs (§2.3), Client.Cancel and CancelJobs end
// jobs wherever they are (queued, delayed, between attempts or running,
// §3.8), and SetLimit caps a kind across the whole fleet — at most N
// running at once, at most R started per period (§2.4, ExampleClient_SetLimit).
//
// # Unique jobs
//
// WithUnique (WithUniqueFor, WithUniqueUntilFinished) makes a job unique
// by a key among the jobs of its queue and kind, beyond the duplicate
// window: for a period, or until the job finished. Enqueue claims the key
// in bucket unique before it publishes the job; while another job holds
// it, Enqueue stores nothing and returns that job's id with Duplicate set.
// The supervisor leader releases a key when the job that holds it ends —
// a dead-lettered or cancelled job always releases it, so a failure never
// blocks the next job — and a failover of the supervisor keeps both the
// claims and the releases (docs/protocol.md §2.5, with the one window a
// crash can leave a key held until its TTL).
//
// Any program that speaks NATS can enqueue a job without this package: one
// message on jobs.<queue>.<kind> (docs/protocol.md §2).
//
// # Status
//
// A job's status is its latest event (docs/protocol.md §3.3): Client.Job
// reads it. Client.Wait waits until the job's run is over and returns its
// final status; a job that was dead-lettered also returns a
// *JobFailedError, and a cancelled one returns no error with the State
// "cancelled" (JobInfo.Succeeded tells success apart).
//
// # Handling jobs
//
// On an agent, agent.AddHandler ties the same args type to its handler, and
// decodes each job's payload into it (see Example).
//
// # Schedules, dead letters, queues, the fleet
//
// The same Client manages schedules (AddSchedule with a Schedule: cron
// with a zone, interval, one-shot, event or dependency triggers; overlap,
// catch-up and DST policies — docs/scheduling.md), dead letters
// (ListDeadLetters, ReplayDeadLetters, PurgeDeadLetters), queues (Queues,
// AddQueue, RemoveQueue), and reads the fleet (Agents, RunningJobs,
// History, Status) — docs/supervision.md. Errors the services return are
// *protocol.Error values with a stable code: match them with
// errors.Is(err, protocol.Code(protocol.CodeNotFound)).
package jetfleet
