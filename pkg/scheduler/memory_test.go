package scheduler

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// BenchmarkIdleScheduleHeap loads 100,000 definitions and states into an
// engine the way the bucket watches do, and reports the heap they hold per
// schedule: the compiled definition, the state, the map entry and the heap
// slot. The definitions are the idle mix of `jetfleet bench` (package
// workload): cron specs in four zones, intervals and one-shots.
func BenchmarkIdleScheduleHeap(b *testing.B) {
	const n = 100_000
	m, err := newMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	created := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	for range b.N {
		b.StopTimer()
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		e := newEngine(&Scheduler{metrics: m})
		e.ctx = context.Background()
		b.StartTimer()
		for i := range n {
			_, doc := workload.IdleSchedule("", i, "default", created)
			def, err := jetfleet.DecodeSchedule(doc)
			if err != nil {
				b.Fatal(err)
			}
			c, err := compile(def)
			if err != nil {
				b.Fatal(err)
			}
			e.applyDef(def.ID, uint64(i+1), c)
			// A state as one fire ago leaves it.
			rt := newRuntime()
			rt.lastNominal = created.Unix()
			rt.lastJobID, rt.lastFireNom, rt.lastFiredAt = jobID(def.ID, created.Unix()), created.Unix(), created.UnixNano()
			rt.fires = 1
			e.applyState(def.ID, uint64(i+1), &rt)
		}
		b.StopTimer()
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/schedule")
		if e.heap.Len() != n {
			b.Fatalf("heap holds %d schedules", e.heap.Len())
		}
		runtime.KeepAlive(e)
	}
}
