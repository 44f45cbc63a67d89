// Command chaos is jetfleet's cluster fault run (issue 21, `go tool task
// chaos`): it brings up the compose stack with three NATS servers and R3
// streams (docker-compose.yml + docker-compose.cluster.yml + this
// directory's compose.chaos.yml), keeps a steady load of jobs and
// one-second schedules on it, injects faults with the Docker CLI — docker
// kill of NATS nodes, of every node at once (power loss), docker network
// disconnect (partitions), docker pause — and prints one row of counts per
// scenario.
//
// Effects are counted apart from jetfleet's own bookkeeping: the agents'
// kind "effect" is an http handler (config only, as an operator would set it)
// that POSTs each execution to the harness's recorder on the host, which
// keeps one record per execution: job id, attempt, schedule id and nominal
// time (Jetfleet-* headers), agent and arrival time. A job whose publish
// JetStream acknowledged and that has no record is lost; a job id with two
// records ran twice; a (schedule, nominal time) with records from two job
// ids is a duplicate fire; one with none is a missed fire.
//
// Files, one concern each:
//
//	main.go          flags, the run, the table, the exit code
//	stack.go         the compose project: up, down, containers, faults
//	recorder.go      the effect recorder (HTTP on the Docker bridge)
//	load.go          acknowledged job publishes at a steady rate; schedules
//	count.go         counting effects against what was published
//	scenarios.go     the scenarios
//
// docs/reliability.md describes every scenario and keeps the latest table.
package main
