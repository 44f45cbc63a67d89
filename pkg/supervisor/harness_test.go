package supervisor_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func TestMain(m *testing.M) {
	natstest.VerifyNoLeaks(m)
}

// fixture is a JetStream server with the topology provisioned, a
// connection for assertions, a client of the supervisor API and every job
// event published.
type fixture struct {
	// stopping waits for killed agents, stopped concurrently at the end.
	stopping *sync.WaitGroup
	srv      *server.Server
	topo     topology.Config
	nc       *nats.Conn
	js       jetstream.JetStream
	events   *fleettest.Events
	client   *jetfleet.Client
	// logs records what the supervisors and agents log.
	logs *fleettest.Logs
}

func setup(t *testing.T, topo topology.Config) *fixture {
	t.Helper()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	require.NoError(t, topology.Ensure(fleettest.Ctx(t, 30*time.Second), js, topo))
	stopping := &sync.WaitGroup{}
	t.Cleanup(stopping.Wait) // runs after every agent's own cleanup
	return &fixture{stopping: stopping, srv: srv, topo: topo, nc: nc, js: js, events: fleettest.WatchJobEvents(t, nc),
		client: jetfleet.NewClient(nc), logs: fleettest.NewLogs()}
}

// startSupervisor starts a replica on its own connection; it is stopped at
// the end of the test (or earlier by the returned stop).
func (f *fixture) startSupervisor(t *testing.T, cfg supervisor.Config, clk clock.Clock) (*supervisor.Supervisor, func()) {
	t.Helper()
	return f.startSupervisorURL(t, "", cfg, clk)
}

// startSupervisorURL is startSupervisor connected to url (the server's
// when empty), a proxy for instance.
func (f *fixture) startSupervisorURL(t *testing.T, url string, cfg supervisor.Config, clk clock.Clock) (*supervisor.Supervisor, func()) {
	t.Helper()
	if url == "" {
		url = f.srv.ClientURL()
	}
	env := fleettest.NewEnvURL(t, url, f.topo)
	env.Logger = f.logs.Wrap(env.Logger)
	if clk == nil {
		clk = clock.Real()
	}
	s, err := supervisor.New(cfg, env.Env, clk)
	require.NoError(t, err)
	require.NoError(t, s.Start(fleettest.Ctx(t, 30*time.Second)))
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			assert.NoError(t, s.Stop(ctx))
		})
	}
	t.Cleanup(stop)
	return s, stop
}

// leader starts a replica and waits until it leads.
func (f *fixture) leader(t *testing.T, cfg supervisor.Config, clk clock.Clock) (*supervisor.Supervisor, func()) {
	t.Helper()
	s, stop := f.startSupervisor(t, cfg, clk)
	require.NoError(t, s.WaitLeading(fleettest.Ctx(t, 20*time.Second), true))
	return s, stop
}

// testAgent is an agent on its own connection, which a test may cut the
// way kill -9 would: the process vanishes without deregistering or handing
// anything back.
type testAgent struct {
	*agent.Agent
	env    *fleettest.Env
	killed atomic.Bool
}

// kill closes the agent's only connection abruptly, without Stop.
func (a *testAgent) kill() {
	a.killed.Store(true)
	a.env.Conn.Close()
}

// startAgent starts an agent connected to url (the server's when empty)
// and stops it at the end of the test.
func (f *fixture) startAgent(t *testing.T, url string, cfg agent.Config, register func(a *agent.Agent)) *testAgent {
	t.Helper()
	if url == "" {
		url = f.srv.ClientURL()
	}
	env := fleettest.NewEnvURL(t, url, f.topo)
	env.Logger = f.logs.Wrap(env.Logger)
	a, err := agent.New(env.Env.Conn, cfg, agent.WithEnv(env.Env))
	require.NoError(t, err)
	register(a)
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	ta := &testAgent{Agent: a, env: env}
	t.Cleanup(func() {
		if ta.killed.Load() {
			// Its open pull requests are never answered: the agent gives
			// them up a few seconds after the last one (fetch_max_wait + 2s).
			// Stop all killed agents at once, and wait at the very end.
			f.stopping.Add(1)
			go func() {
				defer f.stopping.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
				defer cancel()
				_ = a.Stop(ctx) // fails on its closed connection
			}()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second) // handlers waiting for their context are handed back
		defer cancel()
		_ = a.Stop(ctx)
	})
	return ta
}

func must(t *testing.T, err error) {
	t.Helper()
	require.NoError(t, err)
}

// heartbeats collects the heartbeats of one agent.
type heartbeats struct {
	mu   sync.Mutex
	got  []hbAt
	cond chan struct{}
}

type hbAt struct {
	hb *jetfleetpb.Heartbeat
	at time.Time
}

func watchHeartbeats(t *testing.T, nc *nats.Conn, agentID string) *heartbeats {
	t.Helper()
	h := &heartbeats{cond: make(chan struct{})}
	sub, err := nc.Subscribe(protocol.HeartbeatSubject(agentID), func(m *nats.Msg) {
		var hb jetfleetpb.Heartbeat
		if protocol.Unmarshal(m.Data, &hb) != nil {
			return
		}
		h.mu.Lock()
		h.got = append(h.got, hbAt{&hb, time.Now()})
		close(h.cond)
		h.cond = make(chan struct{})
		h.mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return h
}

// wait returns the first heartbeat received after since that matches.
func (h *heartbeats) wait(t *testing.T, timeout time.Duration, since time.Time, match func(*jetfleetpb.Heartbeat) bool) hbAt {
	t.Helper()
	deadline := time.After(timeout)
	for {
		h.mu.Lock()
		for _, g := range h.got {
			if !g.at.Before(since) && match(g.hb) {
				h.mu.Unlock()
				return g
			}
		}
		cond := h.cond
		h.mu.Unlock()
		select {
		case <-cond:
		case <-deadline:
			t.Fatalf("no matching heartbeat within %s", timeout)
		}
	}
}

// waitRegistered waits until the registration of agent id in bucket agents
// matches.
func waitRegistered(t *testing.T, js jetstream.JetStream, id string, match func(*jetfleetpb.Heartbeat) bool) {
	t.Helper()
	ctx := fleettest.Ctx(t, 10*time.Second)
	kv, err := js.KeyValue(ctx, protocol.BucketAgents)
	require.NoError(t, err)
	w, err := kv.Watch(ctx, id, jetstream.IgnoreDeletes())
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			var hb jetfleetpb.Heartbeat
			if protocol.Unmarshal(e.Value(), &hb) == nil && match(&hb) {
				return
			}
		case <-ctx.Done():
			t.Fatalf("no matching registration of %s", id)
		}
	}
}

// maxGap is the longest silence between heartbeats received in [from, to].
func (h *heartbeats) maxGap(from, to time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var gap time.Duration
	prev := from
	for _, g := range h.got {
		if g.at.Before(from) || g.at.After(to) {
			continue
		}
		gap = max(gap, g.at.Sub(prev))
		prev = g.at
	}
	return max(gap, to.Sub(prev))
}

// waitFor polls a condition on server state that no event announces.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond) // polling server state; no event marks it
	}
}

// subscribe collects core NATS messages on subject.
type inbox struct {
	ch chan *nats.Msg
}

func subscribe(t *testing.T, nc *nats.Conn, subject string) *inbox {
	t.Helper()
	in := &inbox{ch: make(chan *nats.Msg, 1024)}
	sub, err := nc.ChanSubscribe(subject, in.ch)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return in
}

func (in *inbox) next(t *testing.T, timeout time.Duration) *nats.Msg {
	t.Helper()
	select {
	case m := <-in.ch:
		return m
	case <-time.After(timeout):
		t.Fatalf("no message within %s", timeout)
		return nil
	}
}

// fast is a supervisor configuration for tests: quick checks and short
// request bounds.
func fast(cfg supervisor.Config) supervisor.Config {
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = 50 * time.Millisecond
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 300 * time.Millisecond
	}
	return cfg
}

// countEvents counts the events of type typ about jobID so far.
func countEvents(e *fleettest.Events, jobID, typ string) int {
	n := 0
	for _, ev := range e.All() {
		if ev.GetJobId() == jobID && ev.GetType() == typ {
			n++
		}
	}
	return n
}
