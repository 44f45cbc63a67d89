package agent

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Settling a finished attempt: one JetStream answer per verdict, after the
// events that must come first.

// passOnDelay is how soon a job of a kind this agent does not run is offered
// again, to the agents that do.
const passOnDelay = 500 * time.Millisecond

// settle applies a verdict to the message and records it.
func (a *Agent) settle(ctx context.Context, ex *execution, v verdict, err error, took time.Duration) {
	job := &ex.job
	job.outcome, job.errorCode = v.event, v.code
	if v.action == actDeadLetter {
		a.deadLetter(ctx, ex, v, err, took)
		return
	}
	ev := a.event(ex, v.event)
	ev.Duration = durationpb.New(took)
	ev.OutputTail = job.output.String()
	if err != nil {
		ev.Error, ev.ErrorCode = protocol.TruncateError(err.Error()), v.code
	}

	switch v.action {
	case actAck:
		if v.event == protocol.EventSucceeded {
			ex.mu.Lock()
			ev.Result = ex.result
			ex.mu.Unlock()
		}
		// The ack waits for the event: a job is never acked without its
		// outcome stored, and if the ack is lost, the redelivery finds
		// "succeeded" and is acked without running again.
		a.answerOnceStored(ex, ev, a.ack)
	case actRetry:
		ev.RetryIn = durationpb.New(v.delay)
		a.recorder.event(ev)
		if nakErr := ex.msg.NakWithDelay(v.delay); nakErr != nil {
			a.logger.Warn("nak failed; JetStream redelivers after AckWait", telemetry.LogJobID, job.ID, telemetry.LogError, nakErr)
		}
	case actSnooze:
		ev.RetryIn = durationpb.New(v.delay)
		a.handBack(ctx, ex, ev, v.delay)
	case actRelease:
		a.release(ctx, ex, errStopping)
	case actCancel:
		a.cancelRun(ex, ev)
	}
}

// cancelRun ends a cancelled job's run: the cancelled event (the job's
// outcome, with the cancel's reason as its error), then, once stored, a
// TERM that removes the job without a dead letter.
func (a *Agent) cancelRun(ex *execution, ev *jetfleetpb.JobEvent) {
	ev.Reason = protocol.ReasonCancelled
	a.answerOnceStored(ex, ev, func(ex *execution) bool {
		if err := ex.msg.TermWithReason(protocol.ReasonCancelled); err != nil {
			a.logger.Warn("term of a cancelled job failed; its next delivery finds the cancelled event", telemetry.LogJobID, ex.job.ID,
				telemetry.LogError, err)
		}
		return false
	})
}

// ack acks the job's message as a request, so the server confirms it
// stored the ack (a double ack); the confirmation is checked as it arrives,
// without holding the job's goroutine (see replies).
func (a *Agent) ack(ex *execution) (confirming bool) {
	msg := &nats.Msg{Subject: ex.msg.Reply(), Data: ackBody}
	if err := a.replies.send(msg, (*unconfirmedAck)(ex)); err != nil {
		if !a.recorder.gate.connected() {
			a.ackOnceReconnected(ex)
			return true
		}
		a.logger.Warn("ack not sent; JetStream delivers the job again and the redelivery is skipped", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
		return false
	}
	return true
}

// ackOnceReconnected sends the ack again once the connection is back (an
// ack is idempotent), sparing the job a redelivery.
func (a *Agent) ackOnceReconnected(ex *execution) {
	go func() {
		if a.recorder.gate.waitConnected(a.recorder.stopped) && a.ack(ex) {
			return
		}
		a.answerConfirmed(ex) // stopped, or not sent: the redelivery is skipped
	}()
}

var ackBody = []byte(protocol.AckBody)

// unconfirmedAck is an execution whose ack awaits the server's confirmation.
type unconfirmedAck execution

func (u *unconfirmedAck) answered(_ []byte, err error) {
	ex := (*execution)(u)
	if errors.Is(err, errDisconnected) {
		u.agent.ackOnceReconnected(ex)
		return
	}
	if err != nil {
		u.agent.logger.Warn("ack not confirmed; a redelivery will be skipped", telemetry.LogJobID, u.job.ID, telemetry.LogError, err)
	}
	u.agent.answerConfirmed(ex)
}

// handBack returns the job to JetStream after delay without spending an
// attempt. Its event counts one more snooze and is stored before the NAK,
// so the next delivery counts attempts right.
func (a *Agent) handBack(ctx context.Context, ex *execution, ev *jetfleetpb.JobEvent, delay time.Duration) {
	ev.Snoozes = ex.snoozes + 1
	writeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.recorder.eventNow(writeCtx, ev); err != nil {
		a.logger.Warn("event not stored before hand-back; the next delivery counts an attempt", telemetry.LogJobID, ex.job.ID,
			"event", ev.GetType(), telemetry.LogError, err)
	}
	if err := ex.msg.NakWithDelay(delay); err != nil {
		a.logger.Warn("nak failed; JetStream redelivers after AckWait", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
	}
}

// release hands a job back for immediate redelivery, without spending an
// attempt: the agent is stopping, or it had no free slot for the delivery
// (cause says which).
func (a *Agent) release(ctx context.Context, ex *execution, cause error) {
	ex.job.outcome = protocol.EventReleased
	ev := a.event(ex, protocol.EventReleased)
	ev.Reason = "agent stopping"
	if errors.Is(cause, errNoSlot) {
		ev.Reason = "no free slot on agent " + a.cfg.ID
	}
	a.handBack(ctx, ex, ev, 0)
}

// passOn hands a job of a kind this agent does not run back, for an agent
// that does.
func (a *Agent) passOn(ctx context.Context, ex *execution, other string) error {
	ex.job.outcome = protocol.EventReleased
	if !ex.claim() {
		return nil
	}
	ev := a.event(ex, protocol.EventReleased)
	ev.Reason = "kind " + ex.job.Kind + " is run by agent " + other
	a.handBack(ctx, ex, ev, passOnDelay)
	return nil
}

// skipDuplicate acks a redelivered job whose earlier attempt succeeded.
func (a *Agent) skipDuplicate(ctx context.Context, ex *execution) error {
	ex.job.outcome = protocol.EventSkippedDuplicate
	if !ex.claim() {
		return nil
	}
	ev := a.event(ex, protocol.EventSkippedDuplicate)
	ev.Reason = "an earlier delivery already succeeded"
	a.answerOnceStored(ex, ev, a.ack)
	return nil
}

// refuse dead-letters a job without running it.
func (a *Agent) refuse(ctx context.Context, ex *execution, reason, code string, err error) error {
	if !ex.claim() {
		return err
	}
	ex.job.outcome, ex.job.errorCode = protocol.EventFailed, code
	a.deadLetter(ctx, ex, verdict{action: actDeadLetter, reason: reason, code: code, event: protocol.EventFailed}, err, 0)
	return err
}
