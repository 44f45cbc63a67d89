// Package scheduler decides when jobs fire and publishes them: durable
// schedules (cron with seconds, descriptors and IANA zones; fixed intervals
// with an anchor and phase; one-shots; event triggers; dependencies with
// fan-in), Temporal-grade policies (overlap, catch-up window and misfire,
// jitter, bounds, pause), and a request/reply API with a Go Client.
//
// Definitions live in bucket schedules, states in bucket schedule_state.
// Any number of replicas run; one leads through a lease in bucket leases and
// alone fires. A fire is published with Nats-Msg-Id = job id =
// sched.<schedule id>.<nominal Unix seconds> before the revision-checked
// state advance, so a crash between the two, or two leaders for a moment,
// yield one job message: JetStream drops the second publish as a duplicate,
// and the second state write fails its revision check.
//
// Every replica mirrors every definition and state in memory (about 600
// bytes per schedule) and keeps a timer heap, so that a new leader fires at
// once. docs/scheduling.md describes the model, the policies, the DST
// policy, the HA argument and the API.
package scheduler
