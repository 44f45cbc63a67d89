package agent_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/bench"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

const benchConcurrency = 50

var benchPayload = []byte(`{"id":12345,"email":"someone@example.com","template":"welcome","locale":"en","x":"0123456789"}`)

// prefill publishes n no-op jobs asynchronously and waits until all are stored.
func prefill(b *testing.B, js jetstream.JetStream, n int) {
	b.Helper()
	for i := range n {
		if _, err := js.PublishMsgAsync(&nats.Msg{Subject: "jobs.default.noop", Data: benchPayload,
			Header: nats.Header{protocol.HeaderJobID: {fmt.Sprintf("bench-%d", i)}}}); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("prefill did not complete")
	}
}

// BenchmarkDrain compares draining a pre-filled queue of no-op jobs through
// one jetfleet agent (status records, events and tracing on, as shipped)
// with a raw JetStream pull-consume loop acking each message the same way
// (double ack, i.e. confirmed), both with 50 jobs in flight. Run both in one
// invocation: go test -run XXX -bench Drain ./agent/
func BenchmarkDrain(b *testing.B) {
	b.Run("raw-jetstream", func(b *testing.B) {
		srv := natstest.Server(b)
		env := fleettest.NewEnv(b, srv, topology.Config{})
		cons, err := topology.EnsureQueue(context.Background(), env.JetStream, topology.Config{}, "default")
		if err != nil {
			b.Fatal(err)
		}
		prefill(b, env.JetStream, b.N)
		var acked atomic.Int64
		done := make(chan struct{})
		work := make(chan jetstream.Msg, benchConcurrency)
		var wg sync.WaitGroup
		for range benchConcurrency {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for msg := range work {
					if err := msg.DoubleAck(context.Background()); err != nil {
						b.Error(err)
					}
					if acked.Add(1) == int64(b.N) {
						close(done)
					}
				}
			}()
		}
		b.ResetTimer()
		start, cpu := time.Now(), bench.ProcessCPU()
		cc, err := cons.Consume(func(msg jetstream.Msg) { work <- msg }, jetstream.PullMaxMessages(benchConcurrency))
		if err != nil {
			b.Fatal(err)
		}
		<-done
		elapsed, cpu := time.Since(start), bench.ProcessCPU()-cpu
		b.StopTimer()
		cc.Stop()
		close(work)
		wg.Wait()
		reportDrain(b, elapsed, cpu)
	})

	b.Run("jetfleet-agent", func(b *testing.B) {
		srv := natstest.Server(b)
		env := fleettest.NewEnv(b, srv, topology.Config{})
		env.Logger = discardLogger()
		// Telemetry as shipped: spans are made (trace ids reach events and
		// logs) and handed to no exporter unless OTLP is configured.
		tel, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		env.Telemetry = tel
		prefill(b, env.JetStream, b.N)
		var handled atomic.Int64
		done := make(chan struct{})
		a, err := agent.New(env.Env.Conn, agent.Config{Concurrency: benchConcurrency}, agent.WithEnv(env.Env))
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Register("noop", func(context.Context, *agent.Job) error {
			return nil
		}, agent.KindOptions{}); err != nil {
			b.Fatal(err)
		}
		// Count settled jobs by their succeeded events, as a user would.
		sub, err := env.Conn.Subscribe(protocol.JobEventsOfType("default", "noop", protocol.EventSucceeded), func(*nats.Msg) {
			if handled.Add(1) == int64(b.N) {
				close(done)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		b.ResetTimer()
		start, cpu := time.Now(), bench.ProcessCPU()
		if err := a.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		<-done
		elapsed, cpu := time.Since(start), bench.ProcessCPU()-cpu
		b.StopTimer()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := a.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		reportDrain(b, elapsed, cpu)
	})
}

// reportDrain reports the rate and the process's CPU time per job (server
// and clients: they share this process), which varies far less from run to
// run on a busy machine than the rate does.
func reportDrain(b *testing.B, elapsed, cpu time.Duration) {
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/job")
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
