package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// windowBuckets is the resolution of a rate window.
const windowBuckets = 60

// rateWindow counts failed and settled attempts over a sliding window, in
// fixed buckets so memory does not grow with the rate.
type rateWindow struct {
	width   time.Duration
	buckets [windowBuckets]rateBucket
}

type rateBucket struct {
	idx        int64
	fail, seen uint32
}

func newRateWindow(window time.Duration) *rateWindow {
	return &rateWindow{width: max(window/windowBuckets, time.Millisecond)}
}

func (w *rateWindow) add(t time.Time, failed bool) {
	idx := t.UnixNano() / int64(w.width)
	b := &w.buckets[idx%windowBuckets]
	if b.idx != idx {
		b.idx, b.fail, b.seen = idx, 0, 0
	}
	b.seen++
	if failed {
		b.fail++
	}
}

// sums returns the failures and attempts of the window ending at now.
func (w *rateWindow) sums(now time.Time) (fail, seen int) {
	cur := now.UnixNano() / int64(w.width)
	for _, b := range w.buckets {
		if b.idx > cur-windowBuckets && b.idx <= cur {
			fail += int(b.fail)
			seen += int(b.seen)
		}
	}
	return fail, seen
}

func (w *rateWindow) clear() { w.buckets = [windowBuckets]rateBucket{} }

// queueRates are one queue's windows and breaker state.
type queueRates struct {
	breaker   *rateWindow
	threshold *rateWindow
	open      bool
	until     time.Time
	// retryAt delays another pause attempt after one failed.
	retryAt time.Time
}

// rates feeds attempt outcomes of each queue to its circuit breaker and to
// the failure-rate alert. The breaker opens by pausing the queue's consumer
// (PauseConsumer, until the cool-down ends: the server resumes it by
// itself should no supervisor be left), and closes by resuming it.
type rates struct {
	s *Supervisor

	mu     sync.Mutex
	queues map[string]*queueRates
	// readThrough is the EVENTS sequence of the last event counted.
	readThrough uint64
}

func newRates(s *Supervisor) *rates { return &rates{s: s, queues: map[string]*queueRates{}} }

func (r *rates) reset() {
	r.mu.Lock()
	r.queues = map[string]*queueRates{}
	r.readThrough = 0
	r.mu.Unlock()
}

// firstRead reports whether the event at EVENTS sequence seq is read for
// the first time by this leadership: events are read in stream order, and
// again after a rewind.
func (r *rates) firstRead(seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq <= r.readThrough {
		return false
	}
	r.readThrough = seq
	return true
}

func (r *rates) queueLocked(queue string) *queueRates {
	q := r.queues[queue]
	if q == nil {
		q = &queueRates{breaker: newRateWindow(r.s.cfg.breakerFor(queue).Window),
			threshold: newRateWindow(r.s.cfg.Thresholds.FailureWindow)}
		r.queues[queue] = q
	}
	return q
}

// record counts one settled attempt of queue that ended at t.
func (r *rates) record(queue string, t time.Time, failed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queueLocked(queue)
	q.breaker.add(t, failed)
	q.threshold.add(t, failed)
}

// evaluate opens breakers and raises failure-rate alerts at now.
func (r *rates) evaluate(ctx context.Context, now time.Time) {
	type opening struct {
		queue      string
		fail, seen int
		policy     BreakerPolicy
	}
	type alerting struct {
		queue      string
		fail, seen int
	}
	var opens []opening
	var alerts []alerting
	r.mu.Lock()
	for name, q := range r.queues {
		if p := r.s.cfg.breakerFor(name); p.FailureRate > 0 && !q.open && !now.Before(q.retryAt) {
			fail, seen := q.breaker.sums(now)
			if seen >= p.MinSamples && seen > 0 && float64(fail)/float64(seen) >= p.FailureRate {
				opens = append(opens, opening{name, fail, seen, p})
			}
		}
		if th := r.s.cfg.Thresholds; th.FailureRate > 0 {
			fail, seen := q.threshold.sums(now)
			if seen >= th.MinSamples && seen > 0 && float64(fail)/float64(seen) >= th.FailureRate {
				alerts = append(alerts, alerting{name, fail, seen})
			}
		}
	}
	r.mu.Unlock()
	for _, o := range opens {
		r.open(ctx, now, o.queue, o.fail, o.seen, o.policy)
	}
	for _, a := range alerts {
		rate := float64(a.fail) / float64(a.seen)
		r.s.alerter.raise(ctx, &jetfleetpb.Alert{Key: "failure_rate:" + a.queue, Type: "failure_rate", Severity: protocol.SeverityWarning,
			Queue: a.queue, Value: rate, Threshold: r.s.cfg.Thresholds.FailureRate,
			Summary: fmt.Sprintf("queue %s: %d of %d attempts failed over %s (%.0f%%)", a.queue, a.fail, a.seen,
				r.s.cfg.Thresholds.FailureWindow, 100*rate)})
	}
}

// open pauses the queue's consumer for the cool-down. The supervisor
// closes the breaker at now + cool_down on its own clock; the pause it asks
// the server for ends cool_down after the request on the real clock — the
// server compares it with its own clock, and resumes the consumer by
// itself should no supervisor be left.
func (r *rates) open(ctx context.Context, now time.Time, queue string, fail, seen int, p BreakerPolicy) {
	s := r.s
	until := now.Add(p.CoolDown)
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	if !s.IsLeader() {
		return
	}
	if err := s.pauseQueue(rctx, queue, time.Now().Add(p.CoolDown)); err != nil {
		s.log.Warn("circuit breaker cannot pause the queue", telemetry.LogQueue, queue, telemetry.LogError, err)
		r.mu.Lock()
		r.queueLocked(queue).retryAt = now.Add(10 * s.cfg.CheckInterval)
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	q := r.queueLocked(queue)
	q.open, q.until = true, until
	r.mu.Unlock()
	s.metrics.setBreaker(queue, true)
	s.metrics.transitions.Add(ctx, 1, attrs("queue", queue, "event", protocol.EventBreakerOpened))
	rate := float64(fail) / float64(seen)
	reason := fmt.Sprintf("%d of %d attempts failed over %s (%.0f%%, threshold %.0f%%)", fail, seen, p.Window, 100*rate, 100*p.FailureRate)
	s.publishQueueEvent(rctx, &jetfleetpb.QueueEvent{Type: protocol.EventBreakerOpened, Queue: queue, Time: timestamppb.New(now),
		Reason: reason, Failures: uint32(fail), Samples: uint32(seen), FailureRate: rate, Window: durationpb.New(p.Window),
		Until: timestamppb.New(until)})
	s.log.Warn("circuit breaker opened: queue paused", telemetry.LogQueue, queue, "until", until, "reason", reason)
	s.alerter.raise(ctx, &jetfleetpb.Alert{Key: "breaker:" + queue, Type: "breaker_opened", Severity: protocol.SeverityCritical,
		Queue: queue, Value: rate, Threshold: p.FailureRate, Reason: reason,
		Summary: fmt.Sprintf("queue %s paused for %s by its circuit breaker: %s", queue, p.CoolDown, reason)})
}

// pauseQueue pauses the consumers of every priority of queue until until.
func (s *Supervisor) pauseQueue(ctx context.Context, queue string, until time.Time) error {
	for _, p := range protocol.Priorities {
		_, err := s.js.PauseConsumer(ctx, protocol.StreamJobs, protocol.PriorityConsumer(queue, p), until)
		if err != nil && !(p != protocol.PriorityDefault && errors.Is(err, jetstream.ErrConsumerNotFound)) {
			return err
		}
	}
	return nil
}

// resumeQueue resumes the consumers of every priority of queue.
func (s *Supervisor) resumeQueue(ctx context.Context, queue string) error {
	for _, p := range protocol.Priorities {
		_, err := s.js.ResumeConsumer(ctx, protocol.StreamJobs, protocol.PriorityConsumer(queue, p))
		if err != nil && !(p != protocol.PriorityDefault && errors.Is(err, jetstream.ErrConsumerNotFound)) {
			return err
		}
	}
	return nil
}

// tick closes breakers whose cool-down ended: the consumer is resumed (the
// server does so itself at the pause deadline; resuming again is harmless)
// and counting starts afresh.
func (r *rates) tick(ctx context.Context, now time.Time) {
	var due []string
	r.mu.Lock()
	for name, q := range r.queues {
		if q.open && !now.Before(q.until) {
			due = append(due, name)
		}
	}
	r.mu.Unlock()
	for _, queue := range due {
		r.close(ctx, now, queue)
	}
}

func (r *rates) close(ctx context.Context, now time.Time, queue string) {
	s := r.s
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	if !s.IsLeader() {
		return
	}
	if err := s.resumeQueue(rctx, queue); err != nil {
		s.log.Warn("circuit breaker cannot resume the queue; retrying", telemetry.LogQueue, queue, telemetry.LogError, err)
		return
	}
	r.mu.Lock()
	q := r.queueLocked(queue)
	q.open = false
	q.breaker.clear()
	r.mu.Unlock()
	s.metrics.setBreaker(queue, false)
	s.metrics.transitions.Add(ctx, 1, attrs("queue", queue, "event", protocol.EventBreakerClosed))
	p := s.cfg.breakerFor(queue)
	s.publishQueueEvent(rctx, &jetfleetpb.QueueEvent{Type: protocol.EventBreakerClosed, Queue: queue, Time: timestamppb.New(now),
		Reason: fmt.Sprintf("cool-down of %s over; queue resumed", p.CoolDown), Window: durationpb.New(p.Window)})
	s.log.Info("circuit breaker closed: queue resumed", telemetry.LogQueue, queue)
}

// adopt takes over breakers a previous leader opened: a queue consumer
// that is paused and whose latest queue event is breaker_opened. It closes
// when the server's pause ends: the time the server says remains, counted
// on the supervisor's clock.
func (r *rates) adopt(ctx context.Context) {
	s := r.s
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	lister := s.jobs.ListConsumers(rctx)
	paused := map[string]time.Duration{}
	for ci := range lister.Info() {
		if queue, p, ok := protocol.ParseQueueConsumer(ci.Name); ok && p == protocol.PriorityDefault && ci.Paused {
			paused[queue] = ci.PauseRemaining
		}
	}
	for queue, remaining := range paused {
		m, err := s.events.GetLastMsgForSubject(rctx, protocol.QueueEventSubject(queue, "*"))
		if err != nil {
			continue
		}
		var ev jetfleetpb.QueueEvent
		if protocol.Unmarshal(m.Data, &ev) != nil || ev.GetType() != protocol.EventBreakerOpened {
			continue
		}
		until := s.clk.Now().Add(remaining)
		r.mu.Lock()
		q := r.queueLocked(queue)
		q.open, q.until = true, until
		r.mu.Unlock()
		s.metrics.setBreaker(queue, true)
		s.log.Info("took over an open circuit breaker", telemetry.LogQueue, queue, "until", until)
	}
}

// breakerState reports a queue's breaker as open or closed.
func (r *rates) breakerState(queue string) (open bool, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.queues[queue]; q != nil && q.open {
		return true, q.until
	}
	return false, time.Time{}
}

func (s *Supervisor) publishQueueEvent(ctx context.Context, ev *jetfleetpb.QueueEvent) {
	data, err := protocol.Marshal(ev)
	if err != nil {
		return
	}
	if _, err := s.js.Publish(ctx, protocol.QueueEventSubject(ev.GetQueue(), ev.GetType()), data,
		jetstream.WithMsgID(fmt.Sprintf("%s:%s:%d", ev.GetType(), ev.GetQueue(), ev.GetTime().AsTime().UnixNano()))); err != nil {
		s.log.Warn("queue event not published", telemetry.LogQueue, ev.GetQueue(), "type", ev.GetType(), telemetry.LogError, err)
	}
}
