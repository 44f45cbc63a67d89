package supervisor

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// The queue-depth gauge, jetfleet_supervisor_queue_jobs{queue,state}: per
// queue, the jobs waiting for an agent (pending: the consumer's
// num_pending), the jobs agents hold now (running: from their heartbeats)
// and the jobs delivered but held by no live agent (delayed: waiting for
// their retry backoff, snooze or AckWait; num_ack_pending − running). The
// leader measures it every queueDepthInterval; other replicas export
// nothing, so a sum over replicas counts each job once.

const queueDepthInterval = 5 * time.Second

type queueDepth struct {
	once sync.Once
	mu   sync.Mutex
	// values: queue → state → jobs; nil while not leading.
	values map[string]map[string]int64
}

// queueDepthLoop is the leader task that measures the gauge.
func (s *Supervisor) queueDepthLoop(ctx context.Context) {
	qd := &s.queueDepthGauge
	qd.once.Do(func() {
		if s.env.Telemetry == nil || s.env.Telemetry.MeterProvider == nil {
			return
		}
		meter := s.env.Telemetry.MeterProvider.Meter("github.com/jetfleet/jetfleet/pkg/supervisor")
		_, err := meter.Int64ObservableGauge("jetfleet.supervisor.queue_jobs",
			metric.WithDescription("Jobs per queue and state: pending (waiting for an agent), running (held by an agent), delayed (delivered, waiting for a retry, snooze or AckWait)"),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				qd.mu.Lock()
				defer qd.mu.Unlock()
				for q, states := range qd.values {
					for st, v := range states {
						o.Observe(v, metric.WithAttributes(attribute.String("queue", q), attribute.String("state", st)))
					}
				}
				return nil
			}))
		if err != nil {
			s.log.Warn("queue depth gauge", telemetry.LogError, err)
		}
	})
	defer func() {
		qd.mu.Lock()
		qd.values = nil
		qd.mu.Unlock()
	}()
	ticker := time.NewTicker(queueDepthInterval)
	defer ticker.Stop()
	for {
		s.measureQueueDepth(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// measureQueueDepth is one measurement of the gauge.
func (s *Supervisor) measureQueueDepth(ctx context.Context) {
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	queues, err := s.queueStatuses(rctx)
	if err != nil {
		return
	}
	running := map[string]int64{}
	for _, j := range s.tracker.running(s.clk.Now()) {
		running[j.Queue]++
	}
	values := map[string]map[string]int64{}
	for _, q := range queues {
		r := running[q.Queue]
		values[q.Queue] = map[string]int64{"pending": int64(q.Pending), "running": r, "delayed": max(0, int64(q.AckPending)-r)}
	}
	qd := &s.queueDepthGauge
	qd.mu.Lock()
	qd.values = values
	qd.mu.Unlock()
}
