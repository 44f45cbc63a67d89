package agent

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Delayed jobs (docs/protocol.md §2.2) are stored in DELAYED as message
// schedules, which the server fires onto JOBS when they are due. A
// producer that speaks plain NATS may instead publish the job to
// jobs.<queue>.<kind> with Jetfleet-Process-At: the agent that receives it
// early moves it to DELAYED, once stored there acks it, and runs nothing.

// delayed reports whether the job is to run later: it carries a process_at
// in the future and was not fired by its schedule (a fired job is due,
// whatever this agent's clock says).
func delayed(ex *execution, now time.Time) bool {
	return !ex.parsed.Fired && ex.parsed.Delayed(now)
}

// moveToDelayed stores the job's message schedule in DELAYED and acks the
// job. The schedule's message id (delay:JOBS:<seq>) makes a redelivery's
// second move the same message.
func (a *Agent) moveToDelayed(ctx context.Context, ex *execution) {
	job := &ex.job
	job.outcome = "delayed"
	h := nats.Header{}
	for k, v := range ex.msg.Headers() {
		if !strings.HasPrefix(k, "Nats-") { // the publisher's dedupe, expectations and TTL are not the schedule's
			h[k] = v
		}
	}
	h.Set(protocol.HeaderJobID, job.ID)
	h.Set(protocol.HeaderMsgID, "delay:"+protocol.StreamJobs+":"+strconv.FormatUint(ex.seq, 10))
	protocol.DelayMsgHeader(h, job.Queue, job.Kind, ex.parsed.Priority, ex.parsed.ProcessAt)
	msg := &nats.Msg{Subject: protocol.DelayedSubject(job.Queue, job.Kind, job.ID), Header: h, Data: job.Payload}
	pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), asyncTimeout)
	defer cancel()
	if _, err := a.js.PublishMsg(pubCtx, msg); err != nil {
		a.logger.Warn("delayed job not stored in "+protocol.StreamDelayed+"; JetStream delivers it again", telemetry.LogJobID, job.ID,
			telemetry.LogError, err)
		if err := ex.msg.NakWithDelay(unstoredOutcomeDelay); err != nil {
			a.logger.Warn("nak failed; JetStream redelivers after AckWait", telemetry.LogJobID, job.ID, telemetry.LogError, err)
		}
		return
	}
	a.logger.Info("job delayed", telemetry.LogJobID, job.ID, "process_at", ex.parsed.ProcessAt.UTC().Format(time.RFC3339Nano))
	a.ack(ex)
}
