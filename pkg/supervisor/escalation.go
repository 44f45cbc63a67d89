package supervisor

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// consumeDeadLetters escalates every new dead letter once (durably, leader
// only), whoever wrote it: it is counted, alerted on (one alert per kind per
// dedupe window) and compensated, per the escalation policy of its kind and
// schedule.
func (s *Supervisor) consumeDeadLetters(ctx context.Context) {
	s.consume(ctx, protocol.StreamDLQ, 64, func(ctx context.Context, msgs []jetstream.Msg) {
		for _, m := range msgs {
			if err := s.escalate(ctx, m); err != nil {
				s.log.Warn("dead letter not escalated; it will be tried again", "subject", m.Subject(), telemetry.LogError, err)
				_ = m.NakWithDelay(time.Second)
				continue
			}
			_ = m.Ack()
		}
	})
}

func (s *Supervisor) escalate(ctx context.Context, m jetstream.Msg) error {
	meta, err := m.Metadata()
	if err != nil {
		return nil
	}
	var dl jetfleetpb.DeadLetter
	if err := protocol.Unmarshal(m.Data(), &dl); err != nil {
		s.log.Warn("undecodable dead letter; not escalated", "subject", m.Subject(), telemetry.LogError, err)
		return nil
	}
	seq := meta.Sequence.Stream
	if meta.NumDelivered == 1 { // not again when a failed escalation is retried
		s.metrics.deadLetters.Add(ctx, 1, attrs("queue", dl.GetQueue(), "reason", dl.GetReason()))
	}
	h := protocol.HeadersFromDoc(dl.GetHeaders())
	_, span := s.jobSpan(ctx, "supervisor.escalate", h, append(jobAttrs(dl.GetJobId(), dl.GetQueue(), dl.GetKind(), dl.GetOriginalSequence()),
		attribute.String("jetfleet.reason", dl.GetReason()), attribute.Int64("jetfleet.dlq_sequence", int64(meta.Sequence.Stream)))...)
	defer span.End()
	scheduleID := h.Get(protocol.HeaderScheduleID)
	policy := s.cfg.policyFor(dl.GetKind(), scheduleID)
	// A workflow step's failure is in its run's one alert (workflows.go).
	_, inWorkflow := protocol.WorkflowRunOfJob(dl.GetJobId())
	if policy.Alert != SeverityNone && !inWorkflow {
		summary := fmt.Sprintf("job %s (%s/%s) failed for good: %s", dl.GetJobId(), dl.GetQueue(), dl.GetKind(), dl.GetReason())
		if e := firstLine(dl.GetLastError()); e != "" {
			summary += ": " + e
		}
		s.alerter.raise(ctx, &jetfleetpb.Alert{Key: "final_failure:" + dl.GetQueue() + "." + dl.GetKind(), Type: "final_failure",
			Severity: policy.Alert, Queue: dl.GetQueue(), Kind: dl.GetKind(), JobId: dl.GetJobId(), ScheduleId: scheduleID,
			AgentId: dl.GetAgentId(), Reason: dl.GetReason(), Error: dl.GetLastError(), TraceId: dl.GetTraceId(),
			DlqSequence: seq, Summary: summary})
	}
	if policy.CompensateKind != "" && h.Get(protocol.HeaderCompensates) == "" {
		return s.compensate(ctx, &dl, seq, h, policy)
	}
	return nil
}

// compensate publishes the compensating job of a dead letter: the
// configured kind with the failed job's payload and headers (but not its
// identity, schedule or attempt settings), Jetfleet-Compensates and
// Jetfleet-Dead-Letter. Its Nats-Msg-Id makes a second escalation of the
// same letter publish nothing.
func (s *Supervisor) compensate(ctx context.Context, dl *jetfleetpb.DeadLetter, seq uint64, h nats.Header, p EscalationPolicy) error {
	queue := p.CompensateQueue
	if queue == "" {
		queue = dl.GetQueue()
	}
	header := nats.Header{}
	for k, v := range h {
		switch {
		case k == protocol.HeaderMsgID, k == protocol.HeaderJobID, k == protocol.HeaderReplayedFrom,
			k == protocol.HeaderScheduleID, k == protocol.HeaderNominalTime, k == protocol.HeaderTimeout,
			k == protocol.HeaderMaxAttempts, k == protocol.HeaderBackoff, strings.HasPrefix(k, "Nats-"):
			continue
		}
		header[k] = v
	}
	dlqRef := protocol.StreamDLQ + ":" + strconv.FormatUint(seq, 10)
	header.Set(protocol.HeaderCompensates, dl.GetJobId())
	header.Set(protocol.HeaderDeadLetter, dlqRef)
	header.Set(protocol.HeaderDeadReason, dl.GetReason())
	header.Set(protocol.HeaderMsgID, "compensate:"+dlqRef)
	job := protocol.Job{ID: "compensate-" + protocol.StreamDLQ + "-" + strconv.FormatUint(seq, 10), Queue: queue,
		Kind: p.CompensateKind, Payload: dl.GetPayload(), Header: header}
	msg, err := job.Msg()
	if err != nil {
		s.log.Error("compensating job is invalid; not published", telemetry.LogJobID, dl.GetJobId(), telemetry.LogError, err)
		return nil
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	if !s.IsLeader() {
		return errNotLeader
	}
	if _, err := s.js.PublishMsg(rctx, msg); err != nil {
		return fmt.Errorf("publish compensating job: %w", err)
	}
	s.log.Info("published a compensating job", telemetry.LogJobID, job.ID, "compensates", dl.GetJobId(), telemetry.LogKind, job.Kind)
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
