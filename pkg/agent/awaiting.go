package agent

import (
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Outcomes that wait to be stored before the job's answer (the ack, or the
// TERM after a dead letter), and the back-pressure they put on pulling.

// answerOnceStored publishes ev, the outcome of ex, and sends the job's
// answer (the ack, or the TERM after its dead letter) once the server
// confirms the event is stored — pipelined: the job's goroutine does not
// wait, while the agent counts such jobs and pulls fewer once too many wait
// (see backedUp). An answer the server confirms in turn (the ack, a double
// ack) keeps the job counted until that confirmation, so unconfirmed acks
// hold the agent back too; answer reports whether it awaits one. An event
// that cannot be stored leaves the job unanswered for good: it is handed
// back, and its next delivery finds what did get stored (docs/protocol.md
// §3.3).
func (a *Agent) answerOnceStored(ex *execution, ev *jetfleetpb.JobEvent, answer func(*execution) (confirming bool)) {
	ex.awaitsOutcome = true
	a.beginAwaiting(ex)
	a.recorder.eventThen(ev, func(stored bool) {
		confirming := false
		if ex.answerSent.CompareAndSwap(false, true) {
			if stored {
				confirming = answer(ex)
			} else {
				a.logger.Warn("outcome of the job not stored; not acked, JetStream delivers it again", telemetry.LogJobID, ex.job.ID,
					"event", ev.GetType())
				if err := ex.msg.NakWithDelay(unstoredOutcomeDelay); err != nil {
					a.logger.Warn("nak failed; JetStream redelivers after AckWait", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
				}
			}
		}
		if confirming {
			// ex stays counted until its answer is confirmed; its slot may
			// take the next job unless too many already wait.
			if !a.backedUp() {
				a.freeSlot(ex)
			}
			return
		}
		a.endAwaiting(ex)
	})
}

// answerConfirmed ends the wait of ex for its answer's confirmation (or for
// giving up on it), if ex was counted among the jobs that wait.
func (a *Agent) answerConfirmed(ex *execution) {
	if ex.awaitsOutcome {
		a.endAwaiting(ex)
	}
}

// unstoredOutcomeDelay is how long a job whose outcome could not be stored
// waits before its redelivery: the events stream is in trouble.
const unstoredOutcomeDelay = 5 * time.Second

// beginAwaiting counts ex among the jobs whose answer waits for their
// outcome to be stored, or for its own confirmation.
func (a *Agent) beginAwaiting(ex *execution) {
	a.awaitMu.Lock()
	a.awaiting[ex] = struct{}{}
	a.awaitMu.Unlock()
}

// endAwaiting stops counting ex and gives back its slot if it kept it.
func (a *Agent) endAwaiting(ex *execution) {
	a.awaitMu.Lock()
	delete(a.awaiting, ex)
	a.awaitMu.Unlock()
	a.freeSlot(ex)
}

// backedUp reports whether as many finished jobs wait for their outcome to
// be stored, or for their ack to be confirmed, as the agent allows: a job
// finishing now keeps its slot until its outcome is stored, so the agent
// pulls fewer jobs.
func (a *Agent) backedUp() bool {
	a.awaitMu.Lock()
	defer a.awaitMu.Unlock()
	return len(a.awaiting) >= a.cfg.MaxUnconfirmed
}

// handBackAwaiting hands back the jobs whose outcome is still not confirmed
// when a stopping agent runs out of time: NAKed at once, their next
// delivery finds the outcome if it was stored after all. It returns how many.
func (a *Agent) handBackAwaiting() int {
	a.awaitMu.Lock()
	waiting := make([]*execution, 0, len(a.awaiting))
	for ex := range a.awaiting {
		waiting = append(waiting, ex)
	}
	a.awaitMu.Unlock()
	n := 0
	for _, ex := range waiting {
		if ex.answerSent.CompareAndSwap(false, true) {
			_ = ex.msg.Nak()
			n++
		}
	}
	return n
}
