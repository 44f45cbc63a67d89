// Package bench measures a jetfleet fleet, side by side with raw JetStream
// in the same run: it is `jetfleet bench`. Each scenario runs its parts in
// this process, each on its own NATS connection, against a fresh embedded
// server per run (file store in a temporary directory) or a given server:
//
//   - throughput: N no-op jobs through K agents of concurrency C, as
//     shipped (events, tracing without an exporter, metrics): the enqueue
//     rate, the drain rate of a filled queue and the end-to-end rate with
//     producer and agents at once, each beside a raw baseline on the same
//     stream and consumer settings (a pull consumer double-acking every
//     message with C in flight), and beside raw + 1 stored event per job,
//     the ceiling of a design that stores an event per job;
//   - latency: a paced load, and the time from publish to handler entry;
//   - schedules: S one-shot schedules due in the same second, their fire
//     delay (stored − nominal time), and the heap a scheduler replica holds
//     per loaded idle schedule;
//   - rescue: an agent holding jobs dies (its connection closes), and the
//     supervisor has them running elsewhere;
//   - failover: the scheduler leader dies, and a new leader fires;
//   - durability: the enqueue and end-to-end rates with the file store's
//     default sync interval and with sync_interval: always.
//
// Every figure is reported as min/median/max over the runs, as a table or
// JSON. docs/performance.md explains each figure and holds the latest
// measurements. The scenarios' building blocks (OneShots, PutSchedules,
// CollectFires, Percentile) are exported for the go test benchmarks of the
// component packages, so that both measure the same way; package workload
// holds the payload and the idle schedule mix they share.
package bench
