package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jetfleet/jetfleet/pkg/bench"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// BenchmarkSimultaneousFires loads 10,000 one-shot schedules due in the
// same second on one leader and measures the scheduling delay of each fire:
// the time JetStream stored the job minus its nominal time. It reports the
// 50th and 99th percentiles. It loads and measures with the same code as
// the schedules scenario of `jetfleet bench` (package bench).
func BenchmarkSimultaneousFires(b *testing.B) {
	const n = 10_000
	srv := natstest.Server(b)
	env := newEnv(b, srv.ClientURL(), topology.Config{})
	r, err := scheduler.New(scheduler.Config{}, newEnv(b, srv.ClientURL(), topology.Config{}).Env, clock.Real())
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(ctx(b, 30*time.Second)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.Stop(context.Background()) })
	if err := r.WaitLeading(ctx(b, 30*time.Second), true); err != nil {
		b.Fatal(err)
	}
	var delays []time.Duration
	for round := range b.N {
		b.StopTimer()
		now := time.Now()
		at := now.Truncate(time.Second).Add(3 * time.Second)
		if err := bench.PutSchedules(ctx(b, 30*time.Second), env.Conn, bench.OneShots(fmt.Sprintf("r%d-", round), n, at, now, "bench", "k")); err != nil {
			b.Fatal(err)
		}
		if err := r.WaitSynced(ctx(b, 30*time.Second)); err != nil {
			b.Fatal(err)
		}
		if time.Now().After(at) {
			b.Fatal("loading took longer than the lead time; raise it")
		}
		b.StartTimer()
		got, err := bench.StoredFires(ctx(b, 60*time.Second), env.JetStream, topology.Config{}, "bench", n)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		for _, f := range got {
			delays = append(delays, f.Delay())
		}
		// Let the replica apply the states its fires wrote before the next
		// round (or Stop: a watch stopped with updates pending leaks its
		// goroutine).
		if err := r.WaitSynced(ctx(b, 30*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(delays)
	ms := func(d time.Duration) float64 { return d.Seconds() * 1000 }
	b.ReportMetric(ms(bench.Percentile(delays, 0.50)), "p50-ms")
	b.ReportMetric(ms(bench.Percentile(delays, 0.99)), "p99-ms")
	b.ReportMetric(ms(delays[len(delays)-1]), "max-ms")
}
