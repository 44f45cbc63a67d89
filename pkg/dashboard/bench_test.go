package dashboard_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/dashboard"
	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// Sizes of the benchmark fleet (issue 18): 10,000 schedules, 100 agents,
// 1,000,000 job events stored.
const (
	benchSchedules = 10_000
	benchAgents    = 100
	benchEvents    = 1_000_000
)

var (
	benchOnce sync.Once
	benchURL  string
	benchErr  error
	// benchStops undo the big fleet, last first (TestMain, after every benchmark).
	benchStops []func()
)

func stopBenchFleet() {
	for i := len(benchStops) - 1; i >= 0; i-- {
		benchStops[i]()
	}
	benchStops = nil
}

// benchFleet builds the big fleet once for every benchmark of the run.
func benchFleet(b *testing.B) string {
	benchOnce.Do(func() { benchURL, benchErr = buildBenchFleet(b) })
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchURL
}

func buildBenchFleet(b *testing.B) (string, error) {
	ctx := context.Background()
	dir, err := tempDir()
	if err != nil {
		return "", err
	}
	fc := devfleet.DefaultConfig()
	fc.Embedded.Port, fc.Embedded.DataDir, fc.Telemetry.HTTPAddr = -1, dir, ""
	fc.Telemetry.LogLevel = "error"
	fc.Dashboard.Listen = devfleet.DashboardOff
	fc.ApplyDefaults()
	benchStops = append(benchStops, func() { _ = os.RemoveAll(dir) })
	fleet, err := devfleet.New(fc, devfleet.Options{})
	if err != nil {
		return "", err
	}
	if err := fleet.Start(ctx); err != nil {
		return "", err
	}
	benchStops = append(benchStops, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = fleet.Stop(sctx)
	})
	nc, err := nats.Connect(fleet.ClientURL())
	if err != nil {
		return "", err
	}
	benchStops = append(benchStops, nc.Close)
	quit := make(chan struct{})
	var beats sync.WaitGroup
	benchStops = append(benchStops, func() { close(quit); beats.Wait() })
	client := jetfleet.NewClient(nc)
	start := time.Now()
	// 10,000 schedules through the API, 8 at a time (yearly: none fires).
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < benchSchedules; i += 8 {
				_, err := client.AddSchedule(ctx, &jetfleet.Schedule{ID: fmt.Sprintf("sched-%05d", i),
					Spec:   jetfleet.Spec{Cron: fmt.Sprintf("%d %d 1 1 *", i%60, i%24), Zone: "Europe/Berlin"},
					Target: jetfleet.Target{Queue: "default", Kind: fmt.Sprintf("kind-%02d", i%50)}})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return "", err
	}
	b.Logf("%d schedules added in %s", benchSchedules, time.Since(start).Round(time.Millisecond))
	// 100 agents heartbeating (each answers its control subject).
	js, _ := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(8192))
	kv, err := js.KeyValue(ctx, protocol.BucketAgents)
	if err != nil {
		return "", err
	}
	for i := range benchAgents {
		id := fmt.Sprintf("bench-agent-%03d", i)
		if _, err := nc.Subscribe(protocol.ControlSubject(id), func(m *nats.Msg) { _ = m.Respond([]byte(`{}`)) }); err != nil {
			return "", err
		}
		beats.Go(func() {
			started := timestamppb.Now()
			for seq := uint64(1); ; seq++ {
				hb := &jetfleetpb.Heartbeat{AgentId: id, Hostname: "bench-host", Pid: int64(1000 + i), Version: "bench", StartedAt: started,
					SentAt: timestamppb.Now(), Interval: durationpb.New(time.Second), Queues: []string{"default"},
					Kinds: []string{"kind-01", "kind-02"}, Capacity: 8, Sequence: seq}
				data, _ := protocol.Marshal(hb)
				_ = nc.Publish(protocol.HeartbeatSubject(id), data)
				_, _ = kv.Put(ctx, id, data)
				select {
				case <-quit:
					return
				case <-time.After(time.Second): // the heartbeat interval: time itself must pass
				}
			}
		})
	}
	// 1,000,000 job events: the runs of 100,000 jobs (started, retried, succeeded or dead).
	start = time.Now()
	types := []string{protocol.EventStarted, protocol.EventStarted, protocol.EventStarted, protocol.EventStarted,
		protocol.EventStarted, protocol.EventStarted, protocol.EventStarted, protocol.EventRetrying, protocol.EventSnoozed, protocol.EventSucceeded}
	now := time.Now()
	for n := 0; n < benchEvents; n++ {
		job, typ := n/10, types[n%10]
		ev := &jetfleetpb.JobEvent{Type: typ, JobId: fmt.Sprintf("bench-job-%06d", job), Queue: "default", Kind: fmt.Sprintf("kind-%02d", job%50),
			Attempt: 1, AgentId: fmt.Sprintf("bench-agent-%03d", job%benchAgents), Time: timestamppb.New(now), StreamSequence: uint64(job + 1),
			Delivered: uint64(n%10 + 1), Duration: durationpb.New(time.Duration(job%1000) * time.Millisecond),
			ScheduleId: fmt.Sprintf("sched-%05d", job%benchSchedules)}
		data, _ := protocol.Marshal(ev)
		if _, err := js.PublishAsync(protocol.JobEventSubject(ev.GetQueue(), ev.GetKind(), typ, ev.GetJobId()), data); err != nil {
			return "", err
		}
		if n%4096 == 4095 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				return "", fmt.Errorf("events not stored in a minute")
			}
		}
	}
	<-js.PublishAsyncComplete()
	b.Logf("%d job events stored in %s", benchEvents, time.Since(start).Round(time.Millisecond))
	// The supervisor reads them (history, trends) at its own pace: the pages
	// are measured while it may still digest them, and the backlog is logged.
	start = time.Now()
	for time.Since(start) < time.Minute {
		cons, err := js.Consumer(ctx, protocol.StreamEvents, "supervisor")
		if err != nil {
			return "", err
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return "", err
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			break
		}
		time.Sleep(time.Second) // polling the consumer's progress
	}
	if cons, err := js.Consumer(ctx, protocol.StreamEvents, "supervisor"); err == nil {
		if info, err := cons.Info(ctx); err == nil {
			b.Logf("after %s the supervisor's history has %d events still to read", time.Since(start).Round(time.Second), info.NumPending)
		}
	}
	before := heapMiB()
	d, err := dashboard.New(dashboard.Config{Listen: "127.0.0.1:0"}, nc, dashboard.Options{})
	if err != nil {
		return "", err
	}
	start = time.Now()
	if err := d.Start(ctx); err != nil {
		return "", err
	}
	b.Logf("the dashboard holds ~%.1f MiB after its start (heap after GC, with the fleet in this process moving too)", heapMiB()-before)
	benchStops = append(benchStops, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Stop(sctx)
	})
	b.Logf("dashboard started in %s", time.Since(start).Round(time.Millisecond))
	return d.URL(), nil
}

func benchGet(b *testing.B, url string) {
	res, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b.Fatalf("%s: %s", url, res.Status)
	}
}

func benchPage(b *testing.B, path string) {
	base := benchFleet(b)
	benchGet(b, base+path) // warm
	warm := heapMiB()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		benchGet(b, base+path)
	}
	b.ReportMetric(float64(time.Since(start).Milliseconds())/float64(b.N), "ms/page")
	// Memory is bounded when rendering keeps nothing: the process's heap
	// after GC does not grow with the pages rendered (the fleet in this
	// process — server, scheduler, supervisor — moves it a little either way).
	b.ReportMetric(heapMiB()-warm, "MiB-heap-growth")
	b.ReportMetric(heapMiB(), "MiB-process-heap")
}

func heapMiB() float64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapAlloc) / (1 << 20)
}

// BenchmarkOverview renders the overview of the big fleet.
func BenchmarkOverview(b *testing.B) { benchPage(b, "/") }

// BenchmarkScheduleList renders the first page of 10,000 schedules.
func BenchmarkScheduleList(b *testing.B) { benchPage(b, "/schedules") }

// BenchmarkScheduleListFiltered renders a page of schedules filtered by id and kind.
func BenchmarkScheduleListFiltered(b *testing.B) { benchPage(b, "/schedules?q=sched-05&kind=kind-07") }

// BenchmarkScheduleListMiddle renders a page in the middle of the list.
func BenchmarkScheduleListMiddle(b *testing.B) { benchPage(b, "/schedules?after=sched-04999") }
