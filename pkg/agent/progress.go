package agent

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

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
	a.publishStartedLocked(ex)
}

// publishStartedLocked is publishStarted with ex.mu held.
func (a *Agent) publishStartedLocked(ex *execution) {
	if ex.settled.Load() || !ex.startedEvent.CompareAndSwap(false, true) {
		return
	}
	a.recorder.event(a.event(ex, protocol.EventStarted))
}

// publishWaiting records that the job waits for its kind's fleet-wide
// limit, and why.
func (a *Agent) publishWaiting(ex *execution, reason string) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.settled.Load() {
		return
	}
	ex.waited = true
	ev := a.event(ex, protocol.EventWaiting)
	ev.Reason = reason
	a.recorder.event(ev)
	a.logger.Info("job waits for its kind's fleet-wide limit", telemetry.LogJobID, ex.job.ID, "reason", reason)
}

// reportProgress records the handler's report and sends it: at once when
// the last progress event of the attempt went out at least
// protocol.ProgressEventInterval ago, else when that interval has passed —
// the latest report then, however many came meanwhile. A report still due
// when the job is answered is dropped (claim). Nothing is sent once the job
// is answered: the job's status is its outcome.
func (ex *execution) reportProgress(fraction float64, message string) error {
	now := time.Now()
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.settled.Load() {
		return nil
	}
	ex.report = progressReport{fraction: fraction, message: message, at: now}
	if ex.progressTimer != nil {
		ex.progressDue = true // the timer sends it
		return nil
	}
	if wait := protocol.ProgressEventInterval - now.Sub(ex.progressSent); wait > 0 {
		ex.progressDue = true
		ex.progressTimer = time.AfterFunc(wait, ex.sendDueProgress)
		return nil
	}
	return ex.sendProgressLocked(now)
}

// sendDueProgress sends the latest report once the interval has passed.
func (ex *execution) sendDueProgress() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.progressTimer = nil
	if !ex.progressDue || ex.settled.Load() {
		return
	}
	now := time.Now()
	if wait := protocol.ProgressEventInterval - now.Sub(ex.progressSent); wait > 0 {
		ex.progressTimer = time.AfterFunc(wait, ex.sendDueProgress) // a timer may fire early
		return
	}
	if err := ex.sendProgressLocked(now); err != nil {
		ex.agent.logger.Warn("progress report failed", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
	}
}

// sendProgressLocked publishes the latest report as a progress event —
// after the attempt's started event, so that the job's latest event is a
// progress event from then on — and tells JetStream the job is in progress
// (+WPI). Called with ex.mu held, the job not answered.
func (ex *execution) sendProgressLocked(now time.Time) error {
	a := ex.agent
	ex.progressDue = false
	ex.progressSent = now
	ex.progressEvents++
	a.publishStartedLocked(ex)
	ev := a.event(ex, protocol.EventProgress)
	ev.Time = timestamppb.New(ex.report.at)
	ev.Progress, ev.ProgressMessage = ex.report.fraction, ex.report.message
	a.recorder.eventWithID(ev, protocol.ProgressEventMsgID(ex.seq, ex.job.Delivered, ex.progressEvents))
	ex.lastProgress = now
	return ex.msg.InProgress()
}
