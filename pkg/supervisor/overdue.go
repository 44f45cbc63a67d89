package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// attemptTimeout is how long the agent gives the attempt of j: its deadline
// minus its start, both on the agent's clock, so host clocks need not agree.
func attemptTimeout(j *jetfleetpb.InFlightJob) (time.Duration, bool) {
	if j.GetDeadline() == nil || j.GetStartedAt() == nil {
		return 0, false
	}
	d := j.GetDeadline().AsTime().Sub(j.GetStartedAt().AsTime())
	return d, d > 0
}

// checkJobs looks at the jobs of live agents: attempts past their timeout
// and the grace get a timeout command, then (after kill grace) are failed
// by the leader; deliveries JetStream has given to another agent are
// listed as ack-overdue.
func (t *tracker) checkJobs(ctx context.Context, now time.Time, leader bool) {
	type held struct {
		agent string
		job   *jetfleetpb.InFlightJob
	}
	var jobs []held
	var overdueJobs []jetfleet.RunningJob
	t.mu.Lock()
	listed := map[deliveryKey]bool{}
	for id, a := range t.agents {
		if a.dead {
			continue
		}
		for _, j := range a.hb.GetJobs() {
			jobs = append(jobs, held{id, j})
			k := deliveryKey{j.GetStreamSequence(), j.GetDelivered()}
			listed[k] = true
			if st := t.overdue[k]; st != nil && (st.failed || st.eventStored) {
				continue // we failed it: the agent ignores its deadline
			}
			if t.ackOverdueLocked(a, j) {
				overdueJobs = append(overdueJobs, runningJob(id, j, "ack_overdue"))
			}
		}
	}
	for k := range t.overdue {
		if !listed[k] {
			delete(t.overdue, k)
		}
	}
	for k := range t.starts {
		if !listed[k] {
			delete(t.starts, k)
		}
	}
	for k := range t.reported {
		if !listed[k] {
			delete(t.reported, k)
		}
	}
	var report []jetfleet.RunningJob
	for _, r := range overdueJobs {
		k := deliveryKey{r.StreamSequence, r.Delivered}
		if !t.reported[k] {
			t.reported[k] = true
			report = append(report, r)
		}
	}
	t.mu.Unlock()
	t.s.metrics.ackOverdue.Store(int64(len(overdueJobs)))

	for _, r := range report {
		t.s.log.Warn("a live agent still runs a job JetStream redelivered: its ack was overdue (no ack or progress within AckWait)",
			telemetry.LogAgentID, r.AgentID, telemetry.LogJobID, r.JobID, "stream_sequence", r.StreamSequence, "delivered", r.Delivered)
		if leader {
			t.s.alerter.raise(ctx, &jetfleetpb.Alert{Key: "ack_overdue:" + r.AgentID, Type: "ack_overdue", Severity: protocol.SeverityWarning,
				AgentId: r.AgentID, JobId: r.JobID, Queue: r.Queue, Kind: r.Kind,
				Summary: fmt.Sprintf("agent %s runs job %s whose ack is overdue: JetStream delivered it again", r.AgentID, r.JobID)})
		}
	}
	if !leader {
		return
	}
	for _, h := range jobs {
		t.checkDeadline(ctx, now, h.agent, h.job)
	}
}

// checkDeadline handles one job of a live agent past its timeout. The
// overrun is a duration on the supervisor's clock: from when the attempt
// started by the supervisor's reckoning (starts) for as long as the agent
// gives it (deadline − started_at, both on the agent's clock). Comparing
// the agent's deadline with the supervisor's clock would turn any clock
// skew between the hosts into early or late cancellations.
func (t *tracker) checkDeadline(ctx context.Context, now time.Time, agent string, j *jetfleetpb.InFlightJob) {
	timeout, ok := attemptTimeout(j)
	if !ok {
		return
	}
	k := deliveryKey{j.GetStreamSequence(), j.GetDelivered()}
	t.mu.Lock()
	start, known := t.starts[k]
	if !known || now.Before(start.Add(timeout+t.s.cfg.DeadlineGrace)) {
		t.mu.Unlock()
		return
	}
	st := t.overdue[k]
	if st == nil {
		st = &overdueState{agent: agent, job: j}
		t.overdue[k] = st
	}
	st.lastSeen = now
	cancelAt, failed := st.cancelAt, st.failed
	if !failed && cancelAt.IsZero() {
		st.cancelAt = now
	}
	t.mu.Unlock()
	ran := now.Sub(start)
	switch {
	case failed:
	case cancelAt.IsZero():
		t.s.timeoutCommand(ctx, agent, j, ran, timeout)
	case now.Sub(cancelAt) >= t.s.cfg.KillGrace:
		if t.s.failAttempt(ctx, agent, j, st, ran, timeout) {
			t.mu.Lock()
			st.failed = true
			t.mu.Unlock()
		}
	}
}

// current reports whether no delivery of the job message later than k was
// seen in any heartbeat.
func (t *tracker) current(k deliveryKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	sd, ok := t.seen[k.seq]
	return !ok || sd.delivered <= k.delivered
}

// timeoutCommand tells the agent running j that the attempt ran past its
// timeout and the grace (protocol.CommandTimeout). It never sends cancel: an agent
// ends a cancelled job as a dead letter with reason cancelled, which would
// turn a timeout into a final failure.
func (s *Supervisor) timeoutCommand(ctx context.Context, agent string, j *jetfleetpb.InFlightJob, ran, timeout time.Duration) {
	log := s.log.With(telemetry.LogAgentID, agent, telemetry.LogJobID, j.GetJobId())
	data, _ := protocol.Marshal(&jetfleetpb.AgentCommand{Action: protocol.CommandTimeout, JobId: j.GetJobId(),
		Reason: fmt.Sprintf("attempt %d has run %s, past its timeout %s and the grace %s", j.GetAttempt(),
			ran.Round(time.Millisecond), timeout, s.cfg.DeadlineGrace)})
	rctx, cancel := context.WithTimeout(ctx, max(s.cfg.ProbeTimeout, time.Second))
	defer cancel()
	reply, err := s.nc.RequestWithContext(rctx, protocol.ControlSubject(agent), data)
	if err != nil {
		log.Warn("timeout command for an overdue job not answered; failing it after kill_grace", telemetry.LogError, err)
		return
	}
	var doc jetfleetpb.Error
	if err := protocol.Unmarshal(reply.Data, &doc); err == nil && doc.GetCode() != "" {
		if doc.GetCode() == protocol.CodeInvalidArgument {
			log.Info("the agent does not know the timeout command; the attempt is failed after kill_grace", "message", doc.GetMessage())
			return
		}
		log.Warn("agent refused the timeout command for an overdue job", "code", doc.GetCode(), "message", doc.GetMessage())
		return
	}
	log.Info("told the agent to time out an overdue job", "ran", ran.Round(time.Millisecond).String(), "timeout", timeout.String())
}

// failAttempt fails an attempt that outlived its timeout, grace and kill
// grace: the job is recorded timed_out and NAKed (the attempt counts) or
// dead-lettered with reason timed_out, per the kind's timeout_action. Its
// progress is kept per delivery in st, so a retry after a failed step
// (the dead-letter stream unavailable, a lost lease) carries on where it
// stopped; the timed_out event it stored itself is no sign the attempt
// ended. It reports whether it is done.
func (s *Supervisor) failAttempt(ctx context.Context, agent string, j *jetfleetpb.InFlightJob, st *overdueState, ran, timeout time.Duration) bool {
	t := s.tracker
	log := s.log.With(telemetry.LogAgentID, agent, telemetry.LogJobID, j.GetJobId())
	ack, err := protocol.ParseAckSubject(j.GetReplySubject())
	if err != nil || ack.Stream != protocol.StreamJobs {
		return true
	}
	k := deliveryKey{j.GetStreamSequence(), ack.Delivered}
	if !t.current(k) {
		return true // delivered again since: this delivery is no longer the job's
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	prev, err := s.latestEvent(rctx, j.GetQueue(), j.GetKind(), j.GetJobId())
	if err != nil {
		log.Warn("cannot read the job's latest event; retrying", telemetry.LogError, err)
		return false
	}
	if prev != nil && prev.GetStreamSequence() == j.GetStreamSequence() {
		if prev.GetDelivered() > ack.Delivered {
			return true // delivered again since
		}
		if prev.GetDelivered() == ack.Delivered {
			switch {
			case protocol.AttemptRunning(prev.GetType()), prev.GetType() == protocol.EventTimedOut, prev.GetType() == protocol.EventRescued:
			default:
				return true // the attempt ended after all
			}
		}
	} else {
		prev = nil
	}
	lastErr := fmt.Sprintf("attempt %d ran %s, past its timeout %s, grace %s and kill grace %s, without ending",
		j.GetAttempt(), ran.Round(time.Millisecond), timeout, s.cfg.DeadlineGrace, s.cfg.KillGrace)
	schedule := ""
	if prev != nil {
		schedule = prev.GetScheduleId()
	}
	policy := s.cfg.policyFor(j.GetKind(), schedule)
	t.mu.Lock()
	stored := st.eventStored
	t.mu.Unlock()
	if !stored {
		if !s.IsLeader() {
			return false
		}
		ev := &jetfleetpb.JobEvent{Type: protocol.EventTimedOut, JobId: j.GetJobId(), Queue: j.GetQueue(), Kind: j.GetKind(),
			Attempt: j.GetAttempt(), AgentId: agent, Time: timestampNow(s.clk), StreamSequence: j.GetStreamSequence(),
			Delivered: ack.Delivered, StartedAt: j.GetStartedAt(), Error: lastErr, ErrorCode: protocol.CodeTimeout,
			Reason: "deadline passed; timeout_action " + policy.TimeoutAction}
		if prev != nil {
			ev.Snoozes, ev.MaxAttempts, ev.ScheduleId, ev.NominalTime, ev.TraceId =
				prev.GetSnoozes(), prev.GetMaxAttempts(), prev.GetScheduleId(), prev.GetNominalTime(), prev.GetTraceId()
		}
		if err := s.publishJobEvent(rctx, ev, protocol.JobEventMsgID(protocol.EventTimedOut, j.GetStreamSequence(), ack.Delivered)); err != nil {
			log.Warn("timed_out event not stored; retrying", telemetry.LogError, err)
			return false
		}
		t.mu.Lock()
		st.eventStored = true
		t.mu.Unlock()
	}
	switch policy.TimeoutAction {
	case TimeoutActionDeadLetter:
		if _, err := s.deadLetterSeq(ctx, j.GetStreamSequence(), protocol.ReasonTimedOut, ack.Delivered, lastErr); err != nil {
			log.Warn("dead letter of a timed-out job failed; retrying", telemetry.LogError, err)
			return false
		}
	default:
		if !s.IsLeader() {
			return false
		}
		if !t.current(k) {
			return true
		}
		if err := protocol.NakOnBehalf(s.nc, j.GetReplySubject()); err != nil {
			log.Warn("NAK of a timed-out job not sent; retrying", telemetry.LogError, err)
			return false
		}
	}
	s.metrics.timeouts.Add(ctx, 1, attrs("queue", j.GetQueue()))
	log.Warn("failed an attempt that ignored its deadline", "action", policy.TimeoutAction)
	s.alerter.raise(ctx, &jetfleetpb.Alert{Key: "timed_out:" + j.GetQueue() + "." + j.GetKind(), Type: "timed_out",
		Severity: protocol.SeverityWarning, Queue: j.GetQueue(), Kind: j.GetKind(), JobId: j.GetJobId(), AgentId: agent,
		Error: lastErr, Summary: fmt.Sprintf("job %s on agent %s ignored its deadline; attempt failed (%s)",
			j.GetJobId(), agent, policy.TimeoutAction)})
	return true
}

// ackOverdueLocked reports whether agent a still holds delivery j although
// JetStream delivered the job message again since (its ack or progress did
// not arrive within AckWait). Heartbeats of two agents have different ages:
// an agent that answered the job (a retry with a short backoff) lists it in
// the heartbeat it sent before, while the agent running the next delivery
// reports it at once. So the holder's listing only counts from a heartbeat
// received one of its intervals after the later delivery was first seen:
// that heartbeat was built after the redelivery.
func (t *tracker) ackOverdueLocked(a *agentView, j *jetfleetpb.InFlightJob) bool {
	sd, ok := t.seen[j.GetStreamSequence()]
	return ok && sd.delivered > j.GetDelivered() && a.lastSeen.Sub(sd.first) >= interval(a.hb)
}
