package scheduler_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natsconn"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// testEnv is a provisioned service.Env on its own connection, with spans
// kept in memory and logs in the test log.
type testEnv struct {
	*service.Env
	Spans *tracetest.InMemoryExporter
}

func newEnv(t testing.TB, url string, topo topology.Config) *testEnv {
	t.Helper()
	spans := tracetest.NewInMemoryExporter()
	tel, err := telemetry.Setup(context.Background(), telemetry.Options{ServiceName: "test", SpanExporter: spans})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	logger := slog.New(telemetry.TraceHandler{Handler: slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})})
	// The services' own connection settings: a disconnection in a test
	// behaves as in production.
	nc, err := natsconn.Connect(natsconn.Config{URL: url}, "test", logger)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.NoError(t, topology.Ensure(ctx(t, 30*time.Second), js, topo))
	return &testEnv{Env: &service.Env{Name: "test", Base: &service.Base{Topology: topo}, Logger: logger, Telemetry: tel, Conn: nc, JetStream: js},
		Spans: spans}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestMain(m *testing.M) {
	natstest.VerifyNoLeaks(m)
}

// fleet is a JetStream server with the topology provisioned, a connection
// for assertions and a client of the scheduler API.
type fleet struct {
	t      *testing.T
	url    string
	topo   topology.Config
	nc     *nats.Conn
	js     jetstream.JetStream
	client *jetfleet.Client
}

func newFleet(t *testing.T, topo topology.Config) *fleet {
	t.Helper()
	srv := natstest.Server(t)
	return newFleetURL(t, srv.ClientURL(), topo)
}

func newFleetURL(t *testing.T, url string, topo topology.Config) *fleet {
	t.Helper()
	env := newEnv(t, url, topo)
	return &fleet{t: t, url: url, topo: topo, nc: env.Conn, js: env.JetStream, client: jetfleet.NewClient(env.Conn)}
}

// replica is one scheduler replica with its own connection.
type replica struct {
	*scheduler.Scheduler
	env     *testEnv
	stopped bool
}

func (f *fleet) replica(cfg scheduler.Config, clk clock.Clock) *replica {
	f.t.Helper()
	return f.replicaAt(f.url, cfg, clk)
}

// replicaAt is replica connected to url: a proxy, for instance.
func (f *fleet) replicaAt(url string, cfg scheduler.Config, clk clock.Clock) *replica {
	f.t.Helper()
	env := newEnv(f.t, url, f.topo)
	s, err := scheduler.New(cfg, env.Env, clk)
	require.NoError(f.t, err)
	require.NoError(f.t, s.Start(ctx(f.t, 30*time.Second)))
	r := &replica{Scheduler: s, env: env}
	f.t.Cleanup(func() { r.stop() })
	return r
}

func (r *replica) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = r.Stop(sctx)
}

// kill ends the replica like a crash: its connection drops first, so it
// neither releases its lease nor writes anything more.
func (r *replica) kill() {
	r.env.Conn.Close()
	r.stop()
}

func ctx(t testing.TB, timeout time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return c
}

func waitLeading(t *testing.T, r *replica) {
	t.Helper()
	require.NoError(t, r.WaitLeading(ctx(t, 30*time.Second), true))
}

// leaderOf waits until exactly one replica leads and returns it.
func leaderOf(t *testing.T, rs ...*replica) *replica {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan *replica, len(rs))
	var wg sync.WaitGroup
	for _, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r.WaitLeading(c, true) == nil {
				got <- r
			}
		}()
	}
	defer wg.Wait()
	defer cancel()
	select {
	case r := <-got:
		return r
	case <-c.Done():
		t.Fatal("no replica became leader")
		return nil
	}
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// jobMessage is a job message stored in JOBS.
type jobMessage struct {
	seq     uint64
	id      string
	subject string
	header  nats.Header
	data    []byte
	stored  time.Time
}

// jobMessages reads every message in JOBS.
func (f *fleet) jobMessages(t *testing.T) []jobMessage {
	t.Helper()
	c := ctx(t, 30*time.Second)
	st, err := f.js.Stream(c, protocol.StreamJobs)
	require.NoError(t, err)
	info, err := st.Info(c)
	require.NoError(t, err)
	var out []jobMessage
	if info.State.Msgs == 0 {
		return out
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(c, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err)
		out = append(out, jobMessage{seq: seq, id: m.Header.Get(protocol.HeaderJobID), subject: m.Subject, header: m.Header, data: m.Data, stored: m.Time})
	}
	return out
}

// scheduleEvents collects schedule events as they are published.
type scheduleEvents struct {
	mu     sync.Mutex
	events []*jetfleetpb.ScheduleEvent
	cond   chan struct{}
}

func watchScheduleEvents(t *testing.T, nc *nats.Conn) *scheduleEvents {
	t.Helper()
	e := &scheduleEvents{cond: make(chan struct{})}
	sub, err := nc.Subscribe(protocol.ScheduleEventsSubjects, func(m *nats.Msg) {
		var ev jetfleetpb.ScheduleEvent
		if err := protocol.Unmarshal(m.Data, &ev); err != nil {
			t.Errorf("undecodable schedule event: %v", err)
			return
		}
		e.mu.Lock()
		e.events = append(e.events, &ev)
		close(e.cond)
		e.cond = make(chan struct{})
		e.mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
	return e
}

func (e *scheduleEvents) all() []*jetfleetpb.ScheduleEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*jetfleetpb.ScheduleEvent(nil), e.events...)
}

// of returns the events of schedule id with type typ.
func (e *scheduleEvents) of(id, typ string) []*jetfleetpb.ScheduleEvent {
	var out []*jetfleetpb.ScheduleEvent
	for _, ev := range e.all() {
		if ev.GetScheduleId() == id && ev.GetType() == typ {
			out = append(out, ev)
		}
	}
	return out
}

// waitN waits until schedule id has n events of type typ.
func (e *scheduleEvents) waitN(t *testing.T, id, typ string, n int) []*jetfleetpb.ScheduleEvent {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		e.mu.Lock()
		cond := e.cond
		e.mu.Unlock()
		if got := e.of(id, typ); len(got) >= n {
			return got
		}
		select {
		case <-cond:
		case <-deadline:
			t.Fatalf("schedule %s: want %d %s events, have %d: %s", id, n, typ, len(e.of(id, typ)), e.summary())
		}
	}
}

func (e *scheduleEvents) summary() string {
	var b strings.Builder
	for _, ev := range e.all() {
		b.WriteString("[" + ev.GetScheduleId() + " " + ev.GetType() + " " + ev.GetJobId() + " " + ev.GetReason() + "] ")
	}
	return b.String()
}

func nominalTimes(evs []*jetfleetpb.ScheduleEvent) []time.Time {
	out := make([]time.Time, len(evs))
	if len(evs) == 0 {
		return []time.Time{}
	}
	for i, ev := range evs {
		out[i] = ev.GetNominalTime().AsTime().UTC()
	}
	return out
}

// interval is a schedule firing every d on queue q, kind k.
func interval(id string, d time.Duration, kind string) *jetfleet.Schedule {
	return &jetfleet.Schedule{ID: id, Spec: jetfleet.Spec{Interval: &jetfleet.Interval{Every: jetfleet.Duration(d)}},
		Target: jetfleet.Target{Queue: "default", Kind: kind}}
}
