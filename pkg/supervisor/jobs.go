package supervisor

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// errNotLeader: the replica no longer leads (its lease lapsed or passed),
// so it does not act on the job streams.
var errNotLeader = errors.New("this supervisor replica no longer leads")

func timestampNow(clk clock.Clock) *timestamppb.Timestamp { return timestamppb.New(clk.Now()) }

// latestEvent reads a job's latest event, its status; nil when it has none.
// Queue and kind may be empty when unknown.
func (s *Supervisor) latestEvent(ctx context.Context, queue, kind, jobID string) (*jetfleetpb.JobEvent, error) {
	ev, _, err := s.latestEventSeq(ctx, queue, kind, jobID)
	return ev, err
}

func (s *Supervisor) latestEventSeq(ctx context.Context, queue, kind, jobID string) (*jetfleetpb.JobEvent, uint64, error) {
	return protocol.LatestJobEvent(ctx, s.events, queue, kind, jobID)
}

// publishJobEvent stores a job event and waits for the server. msgID makes
// the event idempotent when several replicas, or a retry, publish it.
func (s *Supervisor) publishJobEvent(ctx context.Context, ev *jetfleetpb.JobEvent, msgID string) error {
	data, err := protocol.Marshal(ev)
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: protocol.JobEventSubject(ev.GetQueue(), ev.GetKind(), ev.GetType(), ev.GetJobId()), Data: data}
	if msgID != "" {
		msg.Header = nats.Header{protocol.HeaderMsgID: {msgID}}
	}
	_, err = s.js.PublishMsg(ctx, msg)
	return err
}

// deadLetterSeq moves the job message at seq in JOBS to the dead-letter
// stream: GetMsg → publish the DeadLetter with Nats-Msg-Id
// dlq:JOBS:<seq> → dead event → DeleteMsg. Every step is idempotent and a
// message already gone is a no-op, so running it twice, or on two
// replicas, yields one dead letter. It reports whether it wrote one.
// Leadership is checked again right before the steps that act on JOBS and
// DLQ (errNotLeader): a replica whose lease lapsed while it asked the
// server leaves the job to the next leader.
func (s *Supervisor) deadLetterSeq(ctx context.Context, seq uint64, reason string, deliveries uint64, detail string) (bool, error) {
	return s.moveToDLQ(ctx, seq, reason, deliveries, detail, true)
}

// moveToDLQ is deadLetterSeq; fenced checks leadership before the steps
// that act on JOBS and DLQ. An operator's request (a cancel) is not
// fenced: any replica serves it.
func (s *Supervisor) moveToDLQ(ctx context.Context, seq uint64, reason string, deliveries uint64, detail string, fenced bool) (bool, error) {
	s.dlMu.Lock()
	defer s.dlMu.Unlock()
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	m, err := s.jobs.GetMsg(rctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get JOBS %d: %w", seq, err)
	}
	job, _ := protocol.ParseJob(m.Subject, m.Header, m.Data)
	dl := protocol.NewDeadLetter(job, m.Subject, m.Header, m.Data, seq, s.clk.Now())
	_, span := s.jobSpan(rctx, "supervisor.dead_letter", m.Header, append(jobAttrs(dl.GetJobId(), dl.GetQueue(), dl.GetKind(), seq),
		attribute.String("jetfleet.reason", reason))...)
	defer span.End()
	job.ID, job.Queue, job.Kind = dl.GetJobId(), dl.GetQueue(), dl.GetKind()
	prev, err := s.latestEvent(rctx, job.Queue, job.Kind, job.ID)
	if err != nil {
		return false, fmt.Errorf("latest event of %s: %w", job.ID, err)
	}
	if prev != nil && prev.GetStreamSequence() != seq {
		prev = nil
	}
	dl.Reason, dl.Attempts, dl.ErrorCode = reason, uint32(deliveries), protocol.CodeAgentLost
	if prev != nil {
		dl.LastError, dl.TraceId, dl.OutputTail = prev.GetError(), prev.GetTraceId(), prev.GetOutputTail()
		if prev.GetErrorCode() != "" {
			dl.ErrorCode = prev.GetErrorCode()
		}
		if deliveries > uint64(prev.GetSnoozes()) {
			dl.Attempts = uint32(deliveries) - prev.GetSnoozes()
		}
	}
	switch reason {
	case protocol.ReasonTimedOut:
		dl.ErrorCode = protocol.CodeTimeout
	case protocol.ReasonUnroutable:
		dl.ErrorCode = protocol.CodeUnroutable
	case protocol.ReasonInvalidSubject:
		dl.ErrorCode = protocol.CodeInvalidSubject
	case protocol.ReasonCancelled:
		dl.ErrorCode = protocol.CodeCancelled
	}
	if detail != "" {
		if dl.LastError != "" {
			dl.LastError = detail + "; last error: " + dl.LastError
		} else {
			dl.LastError = detail
		}
	}
	dl.LastError = protocol.ToValidUTF8(dl.LastError)
	msg, err := protocol.DeadLetterMsg(dl)
	if err != nil {
		return false, err
	}
	if fenced && !s.IsLeader() {
		return false, errNotLeader
	}
	if _, err := s.js.PublishMsg(rctx, msg); err != nil {
		return false, fmt.Errorf("publish dead letter of JOBS %d: %w", seq, err)
	}
	// The dead event is stored before the job leaves JOBS: removed
	// without it, the job's run would be over with no outcome in its
	// history. Its message id makes a second one (a retry, the agent's
	// own) the same event.
	ev := &jetfleetpb.JobEvent{Type: protocol.EventDead, JobId: job.ID, Queue: job.Queue, Kind: job.Kind,
		Time: timestampNow(s.clk), StreamSequence: seq, Delivered: deliveries, Reason: reason,
		Error: dl.LastError, ErrorCode: dl.ErrorCode, ScheduleId: job.ScheduleID, Attempt: dl.Attempts}
	if !job.NominalTime.IsZero() {
		ev.NominalTime = timestamppb.New(job.NominalTime)
	}
	if prev != nil {
		ev.Snoozes, ev.MaxAttempts, ev.TraceId, ev.StartedAt = prev.GetSnoozes(), prev.GetMaxAttempts(), prev.GetTraceId(), prev.GetStartedAt()
	}
	if err := s.publishJobEvent(rctx, ev, protocol.JobEventMsgID(protocol.EventDead, seq, 0)); err != nil {
		return false, fmt.Errorf("dead event of JOBS %d: %w", seq, err)
	}
	if fenced && !s.IsLeader() {
		return false, errNotLeader
	}
	if err := s.jobs.DeleteMsg(rctx, seq); err != nil {
		// Gone already (another replica, a concurrent TERM) is fine.
		if _, gerr := s.jobs.GetMsg(rctx, seq); !errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return false, fmt.Errorf("delete JOBS %d: %w", seq, err)
		}
	}
	s.log.Warn("dead-lettered a job", telemetry.LogJobID, job.ID, telemetry.LogQueue, job.Queue, telemetry.LogKind, job.Kind,
		"reason", reason, "stream_sequence", seq, "deliveries", deliveries)
	return true, nil
}
