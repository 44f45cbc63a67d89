package devfleet_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetfleet/jetfleet/pkg/devfleet"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

func TestMain(m *testing.M) {
	natstest.VerifyNoLeaks(m)
}

// startFleet runs a dev fleet on a free port with its data in dataDir.
func startFleet(t *testing.T, dataDir string, spans sdktrace.SpanExporter) *devfleet.Fleet {
	t.Helper()
	cfg := devfleet.DefaultConfig()
	cfg.Embedded.Port = -1
	cfg.Embedded.DataDir = dataDir
	cfg.Telemetry.HTTPAddr = "127.0.0.1:0"
	cfg.Dashboard.Listen = "127.0.0.1:0"
	fleet, err := devfleet.New(cfg, devfleet.Options{Logger: fleettest.Logger(t), SpanExporter: spans})
	require.NoError(t, err)
	require.NoError(t, fleet.Start(fleettest.Ctx(t, 30*time.Second)))
	return fleet
}

func stopFleet(t *testing.T, fleet *devfleet.Fleet) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, fleet.Stop(ctx))
}

// TestRawPublishRunsAsOneTrace publishes a job the way any NATS client
// would — plain nats.go, W3C trace context in lowercase headers — and
// checks it succeeds and its execution span continues the publisher's trace.
func TestRawPublishRunsAsOneTrace(t *testing.T) {
	t.Parallel()
	spans := tracetest.NewInMemoryExporter()
	fleet := startFleet(t, t.TempDir(), spans)
	defer stopFleet(t, fleet)
	var summary bytes.Buffer
	fleet.Summary(&summary)
	assert.Contains(t, summary.String(), fleet.ClientURL())
	assert.Contains(t, summary.String(), "kinds echo, fail, sleep")

	// Only nats.go and OpenTelemetry from here on: no project helper.
	nc, err := nats.Connect(fleet.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	succeeded := make(chan *nats.Msg, 1)
	sub, err := nc.Subscribe("events.job.default.echo.succeeded.>", func(m *nats.Msg) { succeeded <- m })
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()

	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, publish := tp.Tracer("publisher").Start(context.Background(), "publish jobs.default.echo")
	msg := nats.NewMsg("jobs.default.echo")
	msg.Data = []byte(`{"hello":"world"}`)
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(msg.Header))
	require.Contains(t, msg.Header, "Traceparent", "http.Header canonicalises keys…")
	msg.Header = nats.Header{"traceparent": msg.Header.Values("Traceparent")} // …but NATS headers are case-sensitive: lowercase
	require.NoError(t, nc.PublishMsg(msg))
	publish.End()

	var ev jetfleetpb.JobEvent
	select {
	case m := <-succeeded:
		require.NoError(t, protocol.Unmarshal(m.Data, &ev))
	case <-time.After(20 * time.Second):
		t.Fatal("the job did not succeed")
	}
	assert.Equal(t, "dev-agent", ev.GetAgentId())
	assert.Equal(t, publish.SpanContext().TraceID().String(), ev.GetTraceId(), "the job ran in the publisher's trace")

	require.Eventually(t, func() bool {
		for _, s := range spans.GetSpans() {
			if s.Name == "agent.execute echo" {
				return s.SpanContext.TraceID() == publish.SpanContext().TraceID() && s.Parent.SpanID() == publish.SpanContext().SpanID()
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "one trace: publish → agent.execute echo")
}

// TestRestartKeepsQueuedJobsAndSchedules stops a dev fleet with jobs queued
// and a schedule stored, starts it again on the same data directory, and
// finds both.
func TestRestartKeepsQueuedJobsAndSchedules(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	fleet := startFleet(t, dataDir, nil)
	nc, err := nats.Connect(fleet.ClientURL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := fleettest.Ctx(t, 30*time.Second)
	// A queue no agent of the dev fleet pulls keeps its jobs queued.
	for _, id := range []string{"parked-1", "parked-2", "parked-3"} {
		fleettest.Publish(t, js, protocol.Job{ID: id, Queue: "parked", Kind: "echo", Payload: []byte(id)})
	}
	client := jetfleet.NewClient(nc)
	_, err = client.AddSchedule(ctx, &jetfleet.Schedule{
		ID:     "hourly-report",
		Spec:   jetfleet.Spec{Cron: "0 * * * *", Zone: "Europe/Berlin"},
		Target: jetfleet.Target{Queue: "default", Kind: "echo"},
	})
	require.NoError(t, err)
	nc.Close()
	stopFleet(t, fleet)

	fleet = startFleet(t, dataDir, nil)
	defer stopFleet(t, fleet)
	nc, err = nats.Connect(fleet.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err = jetstream.New(nc)
	require.NoError(t, err)
	s, err := js.Stream(ctx, protocol.StreamJobs)
	require.NoError(t, err)
	for i, id := range []string{"parked-1", "parked-2", "parked-3"} {
		m, err := s.GetMsg(ctx, uint64(i+1))
		require.NoError(t, err, "queued job %s survived the restart", id)
		assert.Equal(t, []byte(id), m.Data)
	}
	got, err := jetfleet.NewClient(nc).GetSchedule(ctx, "hourly-report")
	require.NoError(t, err, "the schedule survived the restart")
	assert.Equal(t, "0 * * * *", got.Schedule.Spec.Cron)

	// And the restarted fleet runs jobs.
	events := fleettest.WatchJobEvents(t, nc)
	fleettest.Publish(t, js, protocol.Job{ID: "after-restart", Queue: "default", Kind: "echo"})
	events.WaitFor(t, 20*time.Second, "after-restart", protocol.EventSucceeded)
}

func TestDemoKinds(t *testing.T) {
	t.Parallel()
	fleet := startFleet(t, t.TempDir(), nil)
	defer stopFleet(t, fleet)
	nc, err := nats.Connect(fleet.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	events := fleettest.WatchJobEvents(t, nc)
	fleettest.Publish(t, js, protocol.Job{ID: "s", Queue: "default", Kind: "sleep", Payload: []byte(`{"duration":"50ms"}`)})
	fleettest.Publish(t, js, protocol.Job{ID: "f", Queue: "default", Kind: "fail", Payload: []byte(`{"non_retryable":true}`)})
	fleettest.Publish(t, js, protocol.Job{ID: "f2", Queue: "default", Kind: "fail", MaxAttempts: 2, Backoff: []time.Duration{10 * time.Millisecond}})
	fleettest.Publish(t, js, protocol.Job{ID: "bad", Queue: "default", Kind: "sleep", Payload: []byte(`{"duration":"soon"}`)})
	events.WaitFor(t, 20*time.Second, "s", protocol.EventSucceeded)
	assert.Equal(t, protocol.ReasonNonRetryable, events.WaitFor(t, 20*time.Second, "f", protocol.EventDead).GetReason())
	dead := events.WaitFor(t, 20*time.Second, "f2", protocol.EventDead)
	assert.Equal(t, protocol.ReasonMaxAttempts, dead.GetReason())
	assert.Contains(t, dead.GetError(), "demo failure (attempt 2 of 2)")
	assert.Equal(t, protocol.ReasonMalformedPayload, events.WaitFor(t, 20*time.Second, "bad", protocol.EventDead).GetReason())

	// The dev fleet's supervisor serves the dead letters and sees the agent.
	sup := jetfleet.NewClient(nc)
	ctx := fleettest.Ctx(t, 10*time.Second)
	letters, err := sup.ListDeadLetters(ctx, jetfleet.DLQListRequest{})
	require.NoError(t, err)
	assert.Len(t, letters.Letters, 3)
	agents, err := sup.Agents(ctx)
	require.NoError(t, err)
	require.Len(t, agents.Agents, 1)
	assert.Equal(t, "dev-agent", agents.Agents[0].ID)
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	cfg := devfleet.DefaultConfig()
	cfg.Embedded.SyncInterval = "sometimes"
	cfg.Agent.Concurrency = -2
	_, err := devfleet.New(cfg, devfleet.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "embedded.sync_interval")
	assert.Contains(t, err.Error(), "agent.concurrency")
}
