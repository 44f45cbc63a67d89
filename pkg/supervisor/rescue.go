package supervisor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"go.opentelemetry.io/otel/attribute"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// rescue releases every job of the dead agent process a (agent id) that
// has not moved on, for immediate redelivery; see rescueJob.
func (t *tracker) rescue(ctx context.Context, id string, a *agentView) {
	t.mu.Lock()
	if !a.dead || !a.confirmed || a.rescued {
		t.mu.Unlock()
		return
	}
	if a.handled == nil {
		a.handled = map[uint64]bool{}
	}
	var todo []*jetfleetpb.InFlightJob
	for _, j := range a.hb.GetJobs() {
		if !a.handled[j.GetStreamSequence()] {
			todo = append(todo, j)
		}
	}
	silentFor := t.s.clk.Now().Sub(a.lastSeen)
	t.mu.Unlock()

	done := make([]bool, len(todo))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, j := range todo {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			done[i] = t.rescueJob(ctx, id, a, j, silentFor)
		})
	}
	wg.Wait()
	fctx, cancel := t.s.requestCtx(ctx)
	_ = t.s.nc.FlushWithContext(fctx) // the NAKs go out now
	cancel()

	t.mu.Lock()
	defer t.mu.Unlock()
	if !a.dead {
		return
	}
	all := true
	for i, j := range todo {
		if done[i] {
			a.handled[j.GetStreamSequence()] = true
		} else {
			all = false
		}
	}
	a.rescued = all
}

// movedOnLocked reports whether the delivery of j held by the agent process
// a has been superseded: any live agent process lists the same message, or
// a later delivery of it was seen.
func (t *tracker) movedOnLocked(a *agentView, j *jetfleetpb.InFlightJob) bool {
	seq := j.GetStreamSequence()
	if sd, ok := t.seen[seq]; ok && sd.delivered > j.GetDelivered() {
		return true
	}
	for _, other := range t.agents {
		if other == a || other.dead {
			continue
		}
		for _, oj := range other.hb.GetJobs() {
			if oj.GetStreamSequence() == seq {
				return true
			}
		}
	}
	return false
}

// mayRelease reports whether the delivery of j may be NAKed now: its agent
// process is still confirmed dead (no heartbeat since), the delivery has
// not moved on, and this replica leads (its lease's local deadline
// included). Checked right before each step that acts on the job.
func (t *tracker) mayRelease(a *agentView, j *jetfleetpb.InFlightJob) bool {
	t.mu.Lock()
	ok := a.dead && a.confirmed && !t.movedOnLocked(a, j)
	t.mu.Unlock()
	return ok && t.s.IsLeader()
}

func (t *tracker) setUnnaked(k deliveryKey, on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if on {
		t.unnaked[k] = true
	} else {
		delete(t.unnaked, k)
	}
}

func (t *tracker) isUnnaked(k deliveryKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unnaked[k]
}

// rescueJob releases one job of a dead agent process: it records the
// rescued event (carrying the job's snoozes, so the next attempt is
// counted right) and then NAKs the delivery's reply subject, so JetStream
// redelivers at once. A NAK on an older reply subject would act on the
// message's current delivery, so nothing is done when the job has moved
// on: another agent holds it, its latest event shows the delivery settled
// or a later one, or the message left the work stream. Whether the agent
// is still dead and this replica still leads is checked again right
// before the event and right before the NAK: a heartbeat may arrive, or
// the lease may pass, while the server is asked. It reports whether the
// job needs no more attention.
func (t *tracker) rescueJob(ctx context.Context, agent string, a *agentView, j *jetfleetpb.InFlightJob, silentFor time.Duration) bool {
	s := t.s
	log := s.log.With(telemetry.LogAgentID, agent, telemetry.LogJobID, j.GetJobId())
	ack, err := protocol.ParseAckSubject(j.GetReplySubject())
	if err != nil || ack.Stream != protocol.StreamJobs || ack.StreamSequence != j.GetStreamSequence() {
		log.Warn("job of a dead agent has no usable reply subject; JetStream redelivers it after AckWait",
			"reply_subject", j.GetReplySubject())
		return true
	}
	k := deliveryKey{j.GetStreamSequence(), ack.Delivered}
	t.mu.Lock()
	moved := t.movedOnLocked(a, j)
	t.mu.Unlock()
	if moved {
		log.Info("job of a dead agent moved on; not rescued")
		return true
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	jm, err := s.jobs.GetMsg(rctx, j.GetStreamSequence())
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return true // acked or terminated before the agent died
		}
		log.Warn("cannot read the job message; retrying the rescue", telemetry.LogError, err)
		return false
	}
	_, span := s.jobSpan(rctx, "supervisor.rescue", jm.Header, append(jobAttrs(j.GetJobId(), j.GetQueue(), j.GetKind(), j.GetStreamSequence()),
		attribute.String("jetfleet.agent_id", agent))...)
	defer span.End()
	prev, err := s.latestEvent(rctx, j.GetQueue(), j.GetKind(), j.GetJobId())
	if err != nil {
		log.Warn("cannot read the job's latest event; retrying the rescue", telemetry.LogError, err)
		return false
	}
	if prev != nil && prev.GetStreamSequence() == j.GetStreamSequence() {
		settled := prev.GetDelivered() > ack.Delivered
		if prev.GetDelivered() == ack.Delivered {
			switch {
			case protocol.AttemptRunning(prev.GetType()), prev.GetType() == protocol.EventWaiting:
				// started, progress: it still ran; waiting (for its kind's
				// fleet-wide limit): it still held the delivery
			case prev.GetType() == protocol.EventRescued:
				settled = !t.isUnnaked(k) // NAKed by an earlier rescue, unless this replica held the NAK back
			default:
				settled = true
			}
		}
		if settled {
			log.Info("job of a dead agent was settled or delivered again; not rescued", "latest_event", prev.GetType())
			return true
		}
	} else {
		prev = nil // an event of an earlier message with the same job id
	}
	if !t.mayRelease(a, j) {
		return false // rescue re-checks: the agent spoke, the job moved on, or leadership was lost
	}
	ev := &jetfleetpb.JobEvent{
		Type: protocol.EventRescued, JobId: j.GetJobId(), Queue: j.GetQueue(), Kind: j.GetKind(), Attempt: j.GetAttempt(),
		AgentId: agent, Time: timestampNow(s.clk), StreamSequence: j.GetStreamSequence(), Delivered: ack.Delivered,
		StartedAt: j.GetStartedAt(), Error: "agent lost", ErrorCode: protocol.CodeAgentLost,
		Reason: fmt.Sprintf("agent %s sent no heartbeat for %s and did not answer a ping", agent, silentFor.Round(time.Millisecond)),
	}
	if prev != nil {
		ev.Snoozes, ev.MaxAttempts, ev.ScheduleId, ev.NominalTime, ev.TraceId =
			prev.GetSnoozes(), prev.GetMaxAttempts(), prev.GetScheduleId(), prev.GetNominalTime(), prev.GetTraceId()
	}
	// The event first: the next delivery reads it to count attempts, and it
	// must never land after that delivery's own events.
	if err := s.publishJobEvent(rctx, ev, protocol.JobEventMsgID(protocol.EventRescued, j.GetStreamSequence(), ack.Delivered)); err != nil {
		log.Warn("rescued event not stored; retrying the rescue", telemetry.LogError, err)
		return false
	}
	if !t.mayRelease(a, j) {
		t.setUnnaked(k, true)
		log.Warn("rescued event stored but the job not released: the agent spoke again, the job moved on, or this replica no longer leads",
			"stream_sequence", j.GetStreamSequence(), "delivered", ack.Delivered)
		return false
	}
	if err := protocol.NakOnBehalf(s.nc, j.GetReplySubject()); err != nil {
		t.setUnnaked(k, true)
		log.Warn("NAK not sent; retrying the rescue", telemetry.LogError, err)
		return false
	}
	t.setUnnaked(k, false)
	s.metrics.rescues.Add(ctx, 1, attrs("queue", j.GetQueue()))
	log.Info("rescued job of a dead agent", "stream_sequence", j.GetStreamSequence(), "delivered", ack.Delivered)
	return true
}
