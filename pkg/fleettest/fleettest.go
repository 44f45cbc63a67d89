// Package fleettest builds what tests of jetfleet components need around a
// real JetStream server: a provisioned service.Env with an in-memory span
// exporter, a logger that writes to the test log, and small waits on events.
package fleettest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetfleet/jetfleet/pkg/natsconn"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Env is a provisioned environment for one component under test.
type Env struct {
	*service.Env
	Spans *tracetest.InMemoryExporter
}

// NewEnv connects to srv with its own connection, provisions topo and
// returns an environment whose spans land in Spans and whose logs go to t.Log.
func NewEnv(t testing.TB, srv *server.Server, topo topology.Config) *Env {
	t.Helper()
	return NewEnvURL(t, srv.ClientURL(), topo)
}

// NewEnvURL is NewEnv for a server (or cluster) URL.
func NewEnvURL(t testing.TB, url string, topo topology.Config) *Env {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "test", SpanExporter: spans})
	if err != nil {
		t.Fatalf("fleettest: telemetry: %v", err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	// The services' own connection settings (natsconn): a test of a
	// disconnection sees what production does.
	logger := Logger(t)
	nc, err := natsconn.Connect(natsconn.Config{URL: url}, "test", logger)
	if err != nil {
		t.Fatalf("fleettest: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("fleettest: jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Ensure(ctx, js, topo); err != nil {
		t.Fatalf("fleettest: provision: %v", err)
	}
	base := &service.Base{Topology: topo}
	return &Env{
		Env:   &service.Env{Name: "test", Base: base, Logger: logger, Telemetry: tel, Conn: nc, JetStream: js},
		Spans: spans,
	}
}

// Logger writes to the test's log, at debug level.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(telemetry.TraceHandler{Handler: slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})})
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Ctx is a context bounded by timeout and the test's end.
func Ctx(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Events collects job events as they are published.
type Events struct {
	mu     sync.Mutex
	events []*jetfleetpb.JobEvent
	cond   chan struct{}
}

// WatchJobEvents subscribes to every job event on nc.
func WatchJobEvents(t testing.TB, nc *nats.Conn) *Events {
	t.Helper()
	e := &Events{cond: make(chan struct{})}
	sub, err := nc.Subscribe(protocol.JobEventsSubjects, func(m *nats.Msg) {
		var ev jetfleetpb.JobEvent
		if err := protocol.Unmarshal(m.Data, &ev); err != nil {
			t.Errorf("fleettest: undecodable job event on %s: %v", m.Subject, err)
			return
		}
		e.mu.Lock()
		e.events = append(e.events, &ev)
		close(e.cond)
		e.cond = make(chan struct{})
		e.mu.Unlock()
	})
	if err != nil {
		t.Fatalf("fleettest: subscribe events: %v", err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatalf("fleettest: flush: %v", err)
	}
	return e
}

// All returns the events so far.
func (e *Events) All() []*jetfleetpb.JobEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*jetfleetpb.JobEvent(nil), e.events...)
}

// Of returns the events of jobID so far, as their types.
func (e *Events) Of(jobID string) []string {
	var out []string
	for _, ev := range e.All() {
		if ev.GetJobId() == jobID {
			out = append(out, ev.GetType())
		}
	}
	return out
}

// Wait returns the first event matching match, waiting up to timeout.
func (e *Events) Wait(t testing.TB, timeout time.Duration, match func(*jetfleetpb.JobEvent) bool) *jetfleetpb.JobEvent {
	t.Helper()
	deadline := time.After(timeout)
	for {
		e.mu.Lock()
		for _, ev := range e.events {
			if match(ev) {
				e.mu.Unlock()
				return ev
			}
		}
		cond := e.cond
		e.mu.Unlock()
		select {
		case <-cond:
		case <-deadline:
			t.Fatalf("fleettest: no matching job event within %s; got %s", timeout, e.summary())
			return nil
		}
	}
}

// WaitFor waits for an event of type typ about jobID.
func (e *Events) WaitFor(t testing.TB, timeout time.Duration, jobID, typ string) *jetfleetpb.JobEvent {
	t.Helper()
	return e.Wait(t, timeout, func(ev *jetfleetpb.JobEvent) bool { return ev.GetJobId() == jobID && ev.GetType() == typ })
}

func (e *Events) summary() string {
	var b strings.Builder
	for _, ev := range e.All() {
		fmt.Fprintf(&b, "[%s %s attempt %d %s] ", ev.GetJobId(), ev.GetType(), ev.GetAttempt(), ev.GetReason())
	}
	return b.String()
}

// Publish publishes job through JetStream and returns its stream sequence.
func Publish(t testing.TB, js jetstream.JetStream, job protocol.Job) uint64 {
	t.Helper()
	msg, err := job.Msg()
	if err != nil {
		t.Fatalf("fleettest: job: %v", err)
	}
	ack, err := js.PublishMsg(Ctx(t, 10*time.Second), msg)
	if err != nil {
		t.Fatalf("fleettest: publish %s: %v", msg.Subject, err)
	}
	return ack.Sequence
}

// DeadLetters reads every dead letter in the DLQ stream.
func DeadLetters(t testing.TB, js jetstream.JetStream) []*jetfleetpb.DeadLetter {
	t.Helper()
	ctx := Ctx(t, 10*time.Second)
	s, err := js.Stream(ctx, protocol.StreamDLQ)
	if err != nil {
		t.Fatalf("fleettest: DLQ stream: %v", err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("fleettest: DLQ info: %v", err)
	}
	var out []*jetfleetpb.DeadLetter
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		var dl jetfleetpb.DeadLetter
		if err := protocol.Unmarshal(m.Data, &dl); err != nil {
			t.Fatalf("fleettest: dead letter %d: %v", seq, err)
		}
		out = append(out, &dl)
	}
	return out
}

// StreamMsgs is the number of messages in stream.
func StreamMsgs(t testing.TB, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	ctx := Ctx(t, 10*time.Second)
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatalf("fleettest: stream %s: %v", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatalf("fleettest: stream %s info: %v", stream, err)
	}
	return info.State.Msgs
}

// LatestEvent reads a job's latest event, its status.
func LatestEvent(t testing.TB, js jetstream.JetStream, jobID string) *jetfleetpb.JobEvent {
	t.Helper()
	ctx := Ctx(t, 10*time.Second)
	s, err := js.Stream(ctx, protocol.StreamEvents)
	if err != nil {
		t.Fatalf("fleettest: EVENTS stream: %v", err)
	}
	ev, _, err := protocol.LatestJobEvent(ctx, s, "", "", jobID)
	if err != nil || ev == nil {
		t.Fatalf("fleettest: latest event of %s: %v", jobID, err)
	}
	return ev
}

// WaitLatestEvent waits until an event of type typ of jobID is stored in
// EVENTS, then returns the job's latest stored event (which a test may
// expect to be that one). Subscribers see a published event before the
// stream may have stored it, so a test that read LatestEvent right after
// seeing an event on a subscription could read an older one.
func WaitLatestEvent(t testing.TB, js jetstream.JetStream, jobID, typ string, timeout time.Duration) *jetfleetpb.JobEvent {
	t.Helper()
	ctx := Ctx(t, timeout)
	cons, err := js.OrderedConsumer(ctx, protocol.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.JobEventsOfID(jobID)}})
	if err != nil {
		t.Fatalf("fleettest: consumer of %s's events: %v", jobID, err)
	}
	var seen []string
	for {
		m, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatalf("fleettest: no %s event of %s stored within %s (stored: %v): %v", typ, jobID, timeout, seen, err)
		}
		var ev jetfleetpb.JobEvent
		if err := protocol.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatalf("fleettest: event of %s: %v", jobID, err)
		}
		seen = append(seen, ev.GetType())
		if ev.GetType() == typ {
			return LatestEvent(t, js, jobID)
		}
	}
}

// WaitStreamMsgs waits until stream holds want messages. Acks and TERMs are
// fire-and-forget (or confirmed after the event that announces them), so a
// test reads the stream's state after it settles, not at the event.
func WaitStreamMsgs(t testing.TB, js jetstream.JetStream, stream string, want uint64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := StreamMsgs(t, js, stream)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("fleettest: stream %s holds %d messages after %s; want %d", stream, got, timeout, want)
		}
		time.Sleep(10 * time.Millisecond) // polling server state; no event marks it
	}
}
