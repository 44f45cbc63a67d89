package agent

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// deadLetter copies the job to the DLQ stream, then terminates it: TERM
// deletes the message from the work queue, so the copy must be stored first.
func (a *Agent) deadLetter(ctx context.Context, ex *execution, v verdict, cause error, took time.Duration) {
	job := &ex.job
	output := job.output.String()
	dl := protocol.NewDeadLetter(protocol.Job{ID: job.ID, Queue: job.Queue, Kind: job.Kind}, ex.msg.Subject(), job.Headers,
		job.Payload, ex.seq, time.Now())
	dl.Reason, dl.Attempts, dl.ErrorCode = v.reason, uint32(max(job.Attempt, int(job.Delivered)-int(ex.snoozes))), v.code
	dl.AgentId, dl.TraceId, dl.OutputTail = a.cfg.ID, job.TraceID, output
	if cause != nil {
		dl.LastError = protocol.TruncateError(cause.Error())
	}
	msg, err := protocol.DeadLetterMsg(dl)
	if err == nil {
		pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_, err = a.js.PublishMsg(pubCtx, msg)
		cancel()
	}
	if err != nil {
		// Without the copy the job must not be terminated. Store the
		// verdict, so the next delivery dead-letters without running the
		// job again, and try again then.
		a.logger.Error("dead letter not stored; the job will be delivered again", telemetry.LogJobID, job.ID, telemetry.LogError, err)
		verdictEv := a.event(ex, v.event)
		verdictEv.Reason, verdictEv.ErrorCode, verdictEv.Duration = v.reason, v.code, durationpb.New(took)
		if cause != nil {
			verdictEv.Error = dl.GetLastError()
		}
		writeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if werr := a.recorder.eventNow(writeCtx, verdictEv); werr != nil {
			a.logger.Warn("verdict not stored either; the next delivery runs the job again", telemetry.LogJobID, job.ID, telemetry.LogError, werr)
		}
		cancel()
		_ = ex.msg.NakWithDelay(5 * time.Second)
		return
	}
	// The dead letter is stored; its events go next, and the TERM that
	// removes the job once the dead event is stored: should the agent die
	// in between, the next delivery finds them and TERMs without running.
	for _, typ := range []string{v.event, protocol.EventDead} {
		ev := a.event(ex, typ)
		ev.Reason, ev.ErrorCode, ev.Duration, ev.OutputTail = v.reason, v.code, durationpb.New(took), output
		ev.Error = dl.GetLastError()
		if typ != protocol.EventDead {
			a.recorder.event(ev)
			continue
		}
		a.answerOnceStored(ex, ev, func(ex *execution) bool {
			if err := ex.msg.TermWithReason(v.reason); err != nil {
				a.logger.Warn("term failed; the supervisor dead-letters the job again with the same id", telemetry.LogJobID, job.ID, telemetry.LogError, err)
			}
			return false
		})
	}
}
