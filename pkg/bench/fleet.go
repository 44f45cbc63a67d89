package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// kindNoop is the kind of the benchmarks' jobs.
const kindNoop = "noop"

// publish publishes n messages with asynchronous publishes on nc, at most
// the client's default of 4,000 awaiting their ack, and returns once
// JetStream has acknowledged every one.
func publish(ctx context.Context, nc *nats.Conn, n int, msg func(i int) *nats.Msg) error {
	var failed atomic.Int64
	var firstErr atomic.Value
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, _ *nats.Msg, err error) {
		if failed.Add(1) == 1 {
			firstErr.Store(err)
		}
	}))
	if err != nil {
		return err
	}
	for i := range n {
		if _, err := js.PublishMsgAsync(msg(i), jetstream.WithStallWait(time.Minute)); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return fmt.Errorf("waiting for publish acks: %w", ctx.Err())
	}
	if n := failed.Load(); n > 0 {
		return fmt.Errorf("%d publishes failed, the first with: %v", n, firstErr.Load())
	}
	return nil
}

// counter counts messages on a subject and notes when the n-th arrived.
type counter struct {
	sub    *nats.Subscription
	n      int64
	count  atomic.Int64
	done   chan struct{}
	doneAt time.Time
}

// countMessages subscribes nc to subject until it is stopped.
func countMessages(nc *nats.Conn, subject string, n int) (*counter, error) {
	c := &counter{n: int64(n), done: make(chan struct{})}
	sub, err := nc.Subscribe(subject, func(*nats.Msg) { c.add(1) })
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	c.sub = sub
	return c, nc.Flush()
}

func (c *counter) add(k int64) {
	if c.count.Add(k) == c.n {
		c.doneAt = time.Now()
		close(c.done)
	}
}

// wait returns when the n-th message arrived, with its arrival time.
func (c *counter) wait(ctx context.Context, what string) (time.Time, error) {
	select {
	case <-c.done:
		return c.doneAt, nil
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("%s: %d of %d after the phase's time limit: %w", what, c.count.Load(), c.n, ctx.Err())
	}
}

func (c *counter) stop() {
	if c.sub != nil {
		_ = c.sub.Unsubscribe()
	}
}

// agentFleet is K agents of one queue, each on its own connection, with
// events, tracing and metrics as shipped.
type agentFleet struct {
	agents []*agent.Agent
	envs   []*service.Env
}

// newAgents builds k agents of concurrency c (and prefetch) running handler for kind;
// their ids are queue-name-<i>.
func newAgents(rs *runServer, name, queue, kind string, k, c, prefetch int, handler agent.Handler) (*agentFleet, error) {
	f := &agentFleet{}
	for i := range k {
		id := fmt.Sprintf("%s-%s-%d", queue, name, i)
		env, err := rs.connect(id)
		if err != nil {
			return nil, err
		}
		a, err := agent.New(env.Conn, agent.Config{ID: id, Queues: []string{queue}, Concurrency: c, Prefetch: prefetch}, agent.WithEnv(env))
		if err != nil {
			return nil, err
		}
		if err := a.Register(kind, handler, agent.KindOptions{}); err != nil {
			return nil, err
		}
		f.agents = append(f.agents, a)
		f.envs = append(f.envs, env)
	}
	return f, nil
}

func (f *agentFleet) start(ctx context.Context) error {
	for _, a := range f.agents {
		if err := a.Start(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stop stops the agents gracefully, all at once.
func (f *agentFleet) stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	errs := make([]error, len(f.agents))
	var wg sync.WaitGroup
	for i, a := range f.agents {
		wg.Go(func() { errs[i] = a.Stop(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// rawPullHeartbeat is the idle heartbeat a raw consumer asks for. Now and
// then (about 1 run in 30) the server held no request of a raw consumer
// with jobs pending while nats.go counted one open; nats.go only asks again
// after two heartbeats go missing, which at its default (15 s) stalled the
// baseline for 30 s and made that run's ratio meaningless. A lost request
// now costs about a second (an agent notices one within fetch_max_wait
// plus 2 s); under load the server sends no idle heartbeats, so nothing
// else changes.
const rawPullHeartbeat = 500 * time.Millisecond

// rawFleet is the raw JetStream baseline: K consumers of the same durable
// pull consumer an agent binds to (same stream, same consumer settings,
// the same jetfleet job messages),
// each on its own connection, each a jetstream.Consume keeping up to C
// messages requested, handing them to C goroutines that double-ack them
// (ack as a request, confirmed by the server), as the agent acks. With
// withEvent, each goroutine first publishes one event per message, as an
// agent's succeeded event (asynchronously, on a subject of its own).
type rawFleet struct {
	rs      *runServer
	queue   string
	event   []byte // the body of each message's event; nil for none
	k, c    int
	n       int64
	acked   atomic.Int64
	failed  atomic.Int64
	done    chan struct{}
	doneAt  time.Time
	ccs     []jetstream.ConsumeContext
	stopped chan struct{}
	workers sync.WaitGroup
}

// newRaw provisions the queue's consumer for a raw fleet that will ack n messages.
func newRaw(ctx context.Context, rs *runServer, js jetstream.JetStream, queue string, k, c, n int, withEvent bool) (*rawFleet, error) {
	if _, err := topology.EnsureQueue(ctx, js, rs.topo, queue); err != nil {
		return nil, err
	}
	r := &rawFleet{rs: rs, queue: queue, k: k, c: c, n: int64(n), done: make(chan struct{}), stopped: make(chan struct{})}
	if withEvent {
		// What an agent stores for a quick no-op job: its succeeded event.
		now := time.Now()
		var err error
		r.event, err = protocol.Marshal(&jetfleetpb.JobEvent{Type: protocol.EventSucceeded, JobId: queue + "-12345", Queue: queue,
			Kind: kindNoop, Attempt: 1, MaxAttempts: 5, AgentId: queue + "-raw-0", Time: timestamppb.New(now),
			Duration: durationpb.New(50 * time.Microsecond), TraceId: "0af7651916cd43dd8448eb211c80319c", StreamSequence: 12345,
			StartedAt: timestamppb.New(now), Delivered: 1})
		if err != nil {
			return nil, err
		}
	}
	return r, nil
}

// start begins consuming.
func (r *rawFleet) start(ctx context.Context) error {
	for i := range r.k {
		env, err := r.rs.connect(fmt.Sprintf("%s-raw%d", r.queue, i))
		if err != nil {
			return err
		}
		cons, err := env.JetStream.Consumer(ctx, protocol.StreamJobs, protocol.QueueConsumer(r.queue))
		if err != nil {
			return err
		}
		var events jetstream.JetStream
		if r.event != nil {
			events, err = jetstream.New(env.Conn, jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) {
				r.failed.Add(1)
			}))
			if err != nil {
				return err
			}
		}
		work := make(chan jetstream.Msg)
		for range r.c {
			r.workers.Go(func() {
				for {
					var m jetstream.Msg
					select {
					case m = <-work:
					case <-r.stopped:
						return
					}
					if events != nil {
						md, err := m.Metadata()
						if err != nil {
							r.failed.Add(1)
							continue
						}
						subject := protocol.JobEventSubject(r.queue, kindNoop, protocol.EventSucceeded, r.queue+"-"+strconv.FormatUint(md.Sequence.Stream, 10))
						if _, err := events.PublishMsgAsync(&nats.Msg{Subject: subject, Data: r.event}, jetstream.WithStallWait(time.Minute)); err != nil {
							r.failed.Add(1)
						}
					}
					actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					err := m.DoubleAck(actx)
					cancel()
					if err != nil {
						r.failed.Add(1)
						continue
					}
					if r.acked.Add(1) == r.n {
						r.doneAt = time.Now()
						close(r.done)
					}
				}
			})
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case work <- m:
			case <-r.stopped:
			}
		}, jetstream.PullMaxMessages(r.c), jetstream.PullHeartbeat(rawPullHeartbeat))
		if err != nil {
			return err
		}
		r.ccs = append(r.ccs, cc)
	}
	return nil
}

// wait returns when the n-th message was acked, with the time it was.
func (r *rawFleet) wait(ctx context.Context) (time.Time, error) {
	select {
	case <-r.done:
		return r.doneAt, nil
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("raw consumers acked %d of %d (%d acks failed): %w", r.acked.Load(), r.n, r.failed.Load(), ctx.Err())
	}
}

func (r *rawFleet) stop() {
	for _, cc := range r.ccs {
		cc.Stop()
	}
	close(r.stopped)
	r.workers.Wait()
}

// waitQueueEmpty waits until queue's consumer has nothing pending or
// unacknowledged: the acks of a phase are all stored before the next.
func waitQueueEmpty(ctx context.Context, js jetstream.JetStream, queue string) error {
	return waitConsumerDone(ctx, js, protocol.StreamJobs, protocol.QueueConsumer(queue), 30*time.Second, "queue "+queue+" still holds")
}

// waitEventsRead waits until the supervisor has read and acked every job
// event stored so far, so a phase does not pay for the events of the one
// before it.
func waitEventsRead(ctx context.Context, js jetstream.JetStream) error {
	return waitConsumerDone(ctx, js, protocol.StreamEvents, supervisor.ConsumerName, time.Minute, "the supervisor's events consumer still holds")
}

// waitConsumerDone waits up to limit until consumer of stream has nothing
// pending or unacknowledged; past it, the error starts with what.
func waitConsumerDone(ctx context.Context, js jetstream.JetStream, stream, consumer string, limit time.Duration, what string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		cons, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return err
		}
		info := cons.CachedInfo()
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s %d pending and %d unacknowledged messages", what, info.NumPending, info.NumAckPending)
		case <-time.After(5 * time.Millisecond): // polling server state; no event marks it
		}
	}
}

func newJetStream(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
