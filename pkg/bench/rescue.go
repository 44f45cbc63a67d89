package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
)

// Figures of the rescue scenario.
var (
	figRescueRunning = figureSpec{name: "rescue_running", label: "kill → all its jobs running elsewhere", unit: UnitS,
		target: &Target{Value: 3}}
	figRescueComplete = figureSpec{name: "rescue_complete", label: "kill → all its jobs succeeded", unit: UnitS}
)

// rescue kills an agent holding RescueJobs jobs (its connection closes, it
// never stops) while a supervisor leads and another agent waits for work,
// and measures the time from the kill until every job has entered the
// other agent's handler, and until every one succeeded.
//
// Detection depends on where in the dead agent's heartbeat interval it
// dies, so run i of n kills it (i−1)/n of an interval after a heartbeat:
// the first run dies just after one (the worst case), and the runs spread
// over the interval.
func (b *bencher) rescue(ctx context.Context, run int) error {
	rs, err := b.open(ctx, serverOptions{ownFleet: true})
	if err != nil {
		return err
	}
	defer rs.close(ctx)
	n := b.cfg.RescueJobs
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	supEnv, err := rs.connect("supervisor")
	if err != nil {
		return err
	}
	sup, err := supervisor.New(supervisor.Config{}, supEnv, clock.Real())
	if err != nil {
		return err
	}
	if err := sup.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = sup.Stop(context.WithoutCancel(ctx)) }()
	if err := waitLeader(ctx, sup); err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}

	queue := rs.queue("rescue")
	observer, err := rs.connect("observer")
	if err != nil {
		return err
	}
	// The victim holds every job until it dies.
	held := &counter{n: int64(n), done: make(chan struct{})}
	victim, err := newAgents(rs, "victim", queue, kindNoop, 1, n, 0, func(ctx context.Context, _ *agent.Job) error {
		held.add(1)
		<-ctx.Done()
		return ctx.Err()
	})
	if err != nil {
		return err
	}
	defer stopKilled(ctx, victim)
	heartbeats, err := watchHeartbeats(observer.Conn, victim.agents[0].ID())
	if err != nil {
		return err
	}
	defer heartbeats.stop()
	if err := victim.start(ctx); err != nil {
		return err
	}
	producer, err := rs.connect("producer")
	if err != nil {
		return err
	}
	payload := workload.Payload(b.cfg.PayloadSize)
	if err := publish(ctx, producer.Conn, n, func(i int) *nats.Msg {
		m, _ := protocol.Job{ID: fmt.Sprintf("%s-%d", queue, i), Queue: queue, Kind: kindNoop, Payload: payload}.Msg()
		return m
	}); err != nil {
		return err
	}
	if _, err := held.wait(ctx, "jobs held by the agent to kill"); err != nil {
		return err
	}

	// The survivor waits for work; it gets none until the rescue.
	running := &counter{n: int64(n), done: make(chan struct{})}
	var seenMu sync.Mutex
	seen := map[string]bool{}
	survivor, err := newAgents(rs, "survivor", queue, kindNoop, 1, n, 0, func(_ context.Context, job *agent.Job) error {
		seenMu.Lock()
		first := !seen[job.ID]
		seen[job.ID] = true
		seenMu.Unlock()
		if first {
			running.add(1)
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer func() { _ = survivor.stop(ctx) }()
	succeeded, err := countMessages(observer.Conn, protocol.JobEventsOfType(queue, kindNoop, protocol.EventSucceeded), n)
	if err != nil {
		return err
	}
	defer succeeded.stop()
	if err := survivor.start(ctx); err != nil {
		return err
	}

	// Kill (run−1)/runs of an interval after a heartbeat that lists every job.
	if err := heartbeats.waitListing(ctx, n); err != nil {
		return err
	}
	if err := heartbeats.waitNext(ctx); err != nil {
		return err
	}
	offset := time.Duration(float64(agent.DefaultHeartbeatInterval) * float64(run-1) / float64(b.cfg.Runs))
	time.Sleep(offset)
	killed := time.Now()
	victim.envs[0].Conn.Close()

	allRunning, err := running.wait(ctx, "rescued jobs started by the other agent")
	if err != nil {
		return err
	}
	allDone, err := succeeded.wait(ctx, "rescued jobs succeeded")
	if err != nil {
		return err
	}
	b.record(ScenarioRescue, figRescueRunning, allRunning.Sub(killed).Seconds())
	b.record(ScenarioRescue, figRescueComplete, allDone.Sub(killed).Seconds())
	b.progress("rescue run %d: killed %s after a heartbeat; %d jobs running elsewhere after %s", run,
		offset.Round(time.Millisecond), n, allRunning.Sub(killed).Round(time.Millisecond))
	return nil
}

// stopKilled stops agents whose connection was closed: their open pull
// requests are never answered, so the stop takes its whole (short) grace;
// then their goroutines end.
func stopKilled(ctx context.Context, f *agentFleet) {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 500*time.Millisecond)
	defer cancel()
	for _, a := range f.agents {
		_ = a.Stop(stopCtx)
	}
	for _, a := range f.agents {
		if done := a.Done(); done != nil {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
			}
		}
	}
}

// heartbeatWatch follows one agent's heartbeats.
type heartbeatWatch struct {
	sub  *nats.Subscription
	jobs chan int // jobs listed by each heartbeat
}

func watchHeartbeats(nc *nats.Conn, agentID string) (*heartbeatWatch, error) {
	w := &heartbeatWatch{jobs: make(chan int, 64)}
	sub, err := nc.Subscribe(protocol.HeartbeatSubject(agentID), func(m *nats.Msg) {
		var hb jetfleetpb.Heartbeat
		if protocol.Unmarshal(m.Data, &hb) != nil {
			return
		}
		select {
		case w.jobs <- len(hb.GetJobs()):
		default: // nobody waits; only the latest heartbeats matter
		}
	})
	if err != nil {
		return nil, err
	}
	w.sub = sub
	return w, nc.Flush()
}

// waitListing waits for a heartbeat that lists n jobs.
func (w *heartbeatWatch) waitListing(ctx context.Context, n int) error {
	for {
		select {
		case got := <-w.jobs:
			if got >= n {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("no heartbeat listed the %d jobs held: %w", n, ctx.Err())
		}
	}
}

// waitNext waits for a heartbeat that arrives from now on.
func (w *heartbeatWatch) waitNext(ctx context.Context) error {
	for drained := false; !drained; {
		select {
		case <-w.jobs:
		default:
			drained = true
		}
	}
	select {
	case <-w.jobs:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no heartbeat: %w", ctx.Err())
	}
}

func (w *heartbeatWatch) stop() { _ = w.sub.Unsubscribe() }
