// Package e2e holds the tests that treat jetfleet as a deployment: the NATS
// configuration in config/nats and the container stack in docker-compose.yml.
//
//   - permissions_test.go (part of go tool task test) starts config/nats/jetfleet.conf
//     in-process and shows, with real connections, what each NATS user may do: the
//     agent user cannot delete or create streams, delete messages or write schedules,
//     and an agent running as that user still runs jobs once the scheduler and
//     supervisor users provisioned the topology.
//   - stack_test.go (build tag e2e; go tool task e2e) builds the images, brings the
//     compose stack up under a unique project name and checks it end to end: a job
//     from the host, its trace in Jaeger, a cron schedule, a failover of the
//     scheduler leader without a duplicate fire. It needs docker and docker-compose
//     and fails, never skips, without them.
//   - faults/ (a command; go tool task faults) runs the fleet as separate
//     processes and counts what kill -9, SIGSTOP, supervisor kills, NATS
//     restarts and bad input do to jobs, fires, dead letters and history
//     (docs/reliability.md).
package e2e
