// Command faults is jetfleet's fault run (issue 16, `go tool task faults`):
// it runs the real fleet as separate OS processes — a standalone nats-server
// with `sync_interval: always`, three agents, three scheduler replicas and
// one or two supervisors, all built from this checkout — hits it with bad
// input, kill -9, SIGSTOP, supervisor kills and NATS server restarts, and
// prints one row of counts per scenario.
//
// Effects are counted apart from jetfleet's own bookkeeping: every agent
// runs an exec handler, /bin/sh with fixed arguments, that appends a start
// line and an end line per execution to a file of its own process
// (O_APPEND writes of one line are atomic). The end lines are the jobs'
// effects; start and end lines in file order give the most executions one
// agent process ever ran at once. The harness then reads back what jetfleet
// recorded — dead letters (stream DLQ), job and schedule events (EVENTS),
// the supervisor's history (SUPERVISOR) and consumer info — and compares.
//
// Files, one concern each:
//
//	main.go                 flags, signals, the run, the exit code
//	build.go                go build of nats-server and the four services
//	process.go              one OS process: start, log capture, signals
//	natsserver.go           the standalone nats-server, restartable
//	fleet.go                configuration and processes of a fleet
//	publish.go              acknowledged publishes, retried with the same id
//	effects.go              the effect files: executions and concurrency
//	readback.go             what jetfleet stored: streams, consumers, waits
//	count.go                counting a snapshot against what was published
//	scenario_*.go           one scenario each
//	report.go               rows, targets and the table
//
// docs/reliability.md describes every scenario and the latest figures.
package main
