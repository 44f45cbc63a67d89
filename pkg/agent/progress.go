package agent

import (
	"context"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// progress reports the job in progress unless it has been answered: a +WPI
// after a delayed NAK would replace the delay with a full AckWait.
func (ex *execution) progress() error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.settled.Load() {
		return nil
	}
	ex.lastProgress = time.Now()
	return ex.msg.InProgress()
}

// progressLoop tells JetStream that running jobs are still being worked
// on, once a third of their queue's AckWait has passed since the last time,
// so a job may run far longer than AckWait without being redelivered. It
// also publishes the started event of jobs running longer than
// started_event_after.
func (a *Agent) progressLoop(ctx context.Context) {
	interval := a.cfg.StartedEventAfter / 2
	for _, q := range a.queues {
		interval = min(interval, q.ackWait/6)
	}
	t := time.NewTicker(max(interval, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		a.mu.Lock()
		running := make([]*execution, 0, len(a.inflight))
		for _, ex := range a.inflight {
			running = append(running, ex)
		}
		a.mu.Unlock()
		var started []*execution
		for _, ex := range running {
			ex.mu.Lock()
			// Checked and sent under ex.mu: claim waits for it, so no
			// +WPI follows the job's answer.
			if !ex.settled.Load() && now.Sub(ex.lastProgress) >= ex.queue.ackWait/3 {
				ex.lastProgress = now
				if err := ex.msg.InProgress(); err != nil {
					a.logger.Warn("progress report failed", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
				}
			}
			if ex.running && !ex.settled.Load() && now.Sub(ex.started) >= a.cfg.StartedEventAfter && !ex.startedEvent.Load() {
				started = append(started, ex)
			}
			ex.mu.Unlock()
		}
		for _, ex := range started {
			a.publishStarted(ex)
		}
	}
}

// publishStarted publishes the started event of ex, once, unless the job
// has been answered already.
// It is published under ex.mu, which claim waits for, so it never follows
// the job's terminal event (the latest event is the job's status).
func (a *Agent) publishStarted(ex *execution) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.settled.Load() || !ex.startedEvent.CompareAndSwap(false, true) {
		return
	}
	a.recorder.event(a.event(ex, protocol.EventStarted))
}
