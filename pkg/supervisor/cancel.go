package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Cancelling jobs (protocol.APIJobCancel, docs/protocol.md §3.7). Per
// job: an agent that runs it (seen in a heartbeat, or the agent of its
// latest event) is told through its control subject. Otherwise the cancel
// is recorded in bucket cancels — so whichever agent holds or receives the
// job next ends it as cancelled, even when the steps that follow race with
// its delivery — and a job message no agent holds (queued, waiting for a
// retry) is removed from JOBS once its cancelled event is stored. Any
// replica serves a cancel: each step is idempotent.

// cancelScanLimit bounds the JOBS messages one cancel reads looking for
// its jobs: a job further back stays pending, to be ended by the agent
// that receives it; a filtered cancel says it was truncated.
const cancelScanLimit = 20_000

func (s *Supervisor) apiCancel(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.CancelRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.Limit == 0 {
		req.Limit = 1000
	}
	if req.JobID != "" {
		r, err := s.cancelJob(ctx, req)
		if err != nil {
			return nil, err
		}
		return &jetfleet.CancelResponse{Results: []jetfleet.CancelResult{*r}}, nil
	}
	return s.cancelMatching(ctx, req)
}

// cancelTarget is one job a cancel acts on.
type cancelTarget struct {
	jobID string
	// latest is the job's latest event (nil: none), seq its JOBS message
	// when known.
	latest *jetfleetpb.JobEvent
	seq    uint64
}

// cancelJob cancels the job req.JobID.
func (s *Supervisor) cancelJob(ctx context.Context, req jetfleet.CancelRequest) (*jetfleet.CancelResult, error) {
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	latest, err := s.latestEvent(rctx, req.Queue, req.Kind, req.JobID)
	if err != nil {
		return nil, internal(fmt.Errorf("latest event of %s: %w", req.JobID, err))
	}
	holders := s.tracker.holders(req.JobID)
	if latest != nil && !protocol.RunOver(latest.GetType()) && latest.GetAgentId() != "" && !slices.Contains(holders, latest.GetAgentId()) {
		// The agent of its latest event (started, say) may run it before a
		// heartbeat of the agent says so; one that does not answers so.
		holders = append(holders, latest.GetAgentId())
	}
	if r, ok := s.cancelRunning(ctx, req, holders); ok {
		return r, nil
	}
	d, err := protocol.LookupDelayed(rctx, s.delayed, req.Queue, req.Kind, req.JobID)
	if err != nil {
		return nil, internal(fmt.Errorf("look for job %s in %s: %w", req.JobID, protocol.StreamDelayed, err))
	}
	if d != nil {
		// Recorded first: should its schedule fire meanwhile, the agent
		// that receives the job ends it.
		if err := s.recordCancel(rctx, req, req.JobID); err != nil {
			return nil, err
		}
		if r, err := s.removeDelayed(ctx, req, d); err != nil || r != nil {
			return r, err
		}
	}
	if latest != nil && protocol.RunOver(latest.GetType()) {
		return nil, protocol.Errorf(protocol.CodeConflict, "job %s already ended: %s at %s", req.JobID, latest.GetType(),
			latest.GetTime().AsTime().Format(time.RFC3339))
	}
	if err := s.recordCancel(rctx, req, req.JobID); err != nil {
		return nil, err
	}
	t := cancelTarget{jobID: req.JobID, latest: latest}
	if latest != nil {
		t.seq = latest.GetStreamSequence()
	}
	if t.seq == 0 {
		// Never delivered: look for it in its queue.
		_, err := s.scanStream(ctx, s.jobs, req.Subject(), cancelScanLimit, func(seq uint64, subject string, h nats.Header) bool {
			if job, _ := protocol.ParseJob(subject, h, nil); job.ID == req.JobID || protocol.FallbackJobID(seq) == req.JobID {
				t.seq = seq
				return false
			}
			return true
		})
		if err != nil {
			return nil, internal(fmt.Errorf("look for job %s in %s: %w", req.JobID, protocol.StreamJobs, err))
		}
	}
	if t.seq != 0 && !s.tracker.heldSequences()[t.seq] {
		r, err := s.removeCancelled(ctx, req, t)
		if err != nil || r != nil {
			return r, err
		}
	}
	return &jetfleet.CancelResult{JobID: req.JobID, Where: jetfleet.CancelPending}, nil
}

// cancelMatching cancels the jobs that match req's filter, up to req.Limit.
func (s *Supervisor) cancelMatching(ctx context.Context, req jetfleet.CancelRequest) (*jetfleet.CancelResponse, error) {
	res := &jetfleet.CancelResponse{Results: []jetfleet.CancelResult{}}
	done := map[uint64]bool{}
	full := func() bool {
		if len(res.Results) >= req.Limit {
			res.Truncated = true
			return true
		}
		return false
	}
	add := func(r *jetfleet.CancelResult, err error, jobID string) {
		switch {
		case err != nil:
			res.Results = append(res.Results, jetfleet.CancelResult{JobID: jobID, Error: err.Error()})
		case r != nil:
			res.Results = append(res.Results, *r)
		}
	}
	for _, j := range s.tracker.running(s.clk.Now()) {
		if full() {
			return res, nil
		}
		if done[j.StreamSequence] || !s.cancelMatches(ctx, req, j.Queue, j.Kind, j.StreamSequence) {
			continue
		}
		done[j.StreamSequence] = true
		jreq := req
		jreq.JobID = j.JobID
		r, ok := s.cancelRunning(ctx, jreq, s.tracker.holders(j.JobID))
		if !ok {
			// Between attempts now: its message is found below, or the
			// agent that receives it next ends it.
			if err := s.recordCancel(ctx, req, j.JobID); err != nil {
				add(nil, err, j.JobID)
				continue
			}
			r = &jetfleet.CancelResult{JobID: j.JobID, Where: jetfleet.CancelPending}
		}
		add(r, nil, j.JobID)
	}
	var delayed []*protocol.DelayedJob
	complete, err := s.scanStream(ctx, s.delayed, protocol.DelayedFilter(req.Queue, req.Kind), cancelScanLimit,
		func(seq uint64, subject string, h nats.Header) bool {
			if req.ScheduleID != "" && h.Get(protocol.HeaderScheduleID) != req.ScheduleID {
				return true
			}
			if len(res.Results)+len(delayed) >= req.Limit {
				return false
			}
			delayed = append(delayed, protocol.DelayedJobOf(subject, h.Get(protocol.HeaderNatsSchedule), seq))
			return true
		})
	if err != nil {
		return nil, internal(fmt.Errorf("look for jobs in %s: %w", protocol.StreamDelayed, err))
	}
	if !complete {
		res.Truncated = true
	}
	for _, d := range delayed {
		if err := s.recordCancel(ctx, req, d.JobID); err != nil {
			add(nil, err, d.JobID)
			continue
		}
		r, err := s.removeDelayed(ctx, req, d)
		if err == nil && r == nil {
			continue // fired meanwhile: found in JOBS below
		}
		add(r, err, d.JobID)
	}
	if res.Truncated {
		return res, nil
	}

	held := s.tracker.heldSequences()
	var found []cancelTarget
	complete, err = s.scanStream(ctx, s.jobs, req.Subject(), cancelScanLimit, func(seq uint64, subject string, h nats.Header) bool {
		if done[seq] || held[seq] {
			return true
		}
		job, _ := protocol.ParseJob(subject, h, nil)
		if req.ScheduleID != "" && job.ScheduleID != req.ScheduleID {
			return true
		}
		if job.ID == "" {
			job.ID = protocol.FallbackJobID(seq)
		}
		if len(res.Results)+len(found) >= req.Limit {
			return false // one more than the limit matches
		}
		found = append(found, cancelTarget{jobID: job.ID, seq: seq})
		return true
	})
	if err != nil {
		return nil, internal(fmt.Errorf("look for jobs in %s: %w", protocol.StreamJobs, err))
	}
	if !complete {
		res.Truncated = true
	}
	for _, t := range found {
		if err := s.recordCancel(ctx, req, t.jobID); err != nil {
			add(nil, err, t.jobID)
			continue
		}
		rctx, cancel := s.requestCtx(ctx)
		t.latest, err = s.latestEvent(rctx, "", "", t.jobID)
		cancel()
		if err != nil {
			add(nil, err, t.jobID)
			continue
		}
		r, err := s.removeCancelled(ctx, req, t)
		if err == nil && r == nil {
			continue // ended meanwhile
		}
		add(r, err, t.jobID)
	}
	return res, nil
}

// cancelMatches reports whether the running job at seq matches req's filter.
func (s *Supervisor) cancelMatches(ctx context.Context, req jetfleet.CancelRequest, queue, kind string, seq uint64) bool {
	if (req.Queue != "" && queue != req.Queue) || (req.Kind != "" && kind != req.Kind) {
		return false
	}
	if req.ScheduleID == "" {
		return true
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	m, err := s.jobs.GetMsg(rctx, seq)
	return err == nil && m.Header.Get(protocol.HeaderScheduleID) == req.ScheduleID
}

// recordCancel stores the cancel of jobID in bucket cancels.
func (s *Supervisor) recordCancel(ctx context.Context, req jetfleet.CancelRequest, jobID string) error {
	data, err := protocol.Marshal(&jetfleetpb.JobCancel{JobId: jobID, Reason: req.Reason, DeadLetter: req.DeadLetter,
		RequestedAt: timestampNow(s.clk), RequestedBy: req.RequestedBy})
	if err != nil {
		return internal(err)
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	if _, err := s.cancelsKV.Put(rctx, protocol.JobToken(jobID), data); err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "record the cancel of %s in bucket %s: %v", jobID, protocol.BucketCancels, err)
	}
	return nil
}

// cancelRunning tells the agents that hold the job (per their heartbeats)
// to cancel it. It reports false when none took the command: the job
// ended or moved on meanwhile.
func (s *Supervisor) cancelRunning(ctx context.Context, req jetfleet.CancelRequest, holders []string) (*jetfleet.CancelResult, bool) {
	for _, agentID := range holders {
		data, _ := protocol.Marshal(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: req.JobID,
			Reason: cancelReason(req), DeadLetter: req.DeadLetter})
		rctx, cancel := context.WithTimeout(ctx, max(s.cfg.ProbeTimeout, time.Second))
		reply, err := s.nc.RequestWithContext(rctx, protocol.ControlSubject(agentID), data)
		cancel()
		log := s.log.With(telemetry.LogAgentID, agentID, telemetry.LogJobID, req.JobID)
		if err != nil {
			// The cancel waits in bucket cancels: the agent ends the job
			// when it sees it there.
			log.Warn("cancel command not answered", telemetry.LogError, err)
			return &jetfleet.CancelResult{JobID: req.JobID, Where: jetfleet.CancelRunning, AgentID: agentID}, true
		}
		var doc jetfleetpb.Error
		if err := protocol.Unmarshal(reply.Data, &doc); err == nil && doc.GetCode() != "" {
			log.Info("agent did not cancel the job", "code", doc.GetCode(), "message", doc.GetMessage())
			continue
		}
		log.Info("told the agent to cancel a job", "reason", req.Reason, "requested_by", req.RequestedBy)
		return &jetfleet.CancelResult{JobID: req.JobID, Where: jetfleet.CancelRunning, AgentID: agentID}, true
	}
	return nil, false
}

func cancelReason(req jetfleet.CancelRequest) string {
	reason := "cancelled"
	if req.RequestedBy != "" {
		reason += " by " + req.RequestedBy
	}
	if req.Reason != "" {
		reason += ": " + req.Reason
	}
	return reason
}

// removeCancelled ends the run of a job whose message no agent holds: its
// cancelled event (or its dead letter, req.DeadLetter), then the message
// leaves JOBS. It returns nil when the message is gone already.
func (s *Supervisor) removeCancelled(ctx context.Context, req jetfleet.CancelRequest, t cancelTarget) (*jetfleet.CancelResult, error) {
	where := jetfleet.CancelQueued
	var delivered uint64
	if t.latest != nil && t.latest.GetStreamSequence() == t.seq {
		if protocol.RunOver(t.latest.GetType()) {
			return nil, nil
		}
		where, delivered = jetfleet.CancelRetrying, t.latest.GetDelivered()
	}
	result := &jetfleet.CancelResult{JobID: t.jobID, Where: where}
	if req.DeadLetter {
		wrote, err := s.moveToDLQ(ctx, t.seq, protocol.ReasonCancelled, delivered, cancelReason(req), false)
		if err != nil {
			return nil, internal(err)
		}
		if !wrote {
			return nil, nil
		}
		return result, nil
	}
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	m, err := s.jobs.GetMsg(rctx, t.seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, internal(fmt.Errorf("get %s %d: %w", protocol.StreamJobs, t.seq, err))
	}
	job, _ := protocol.ParseJob(m.Subject, m.Header, nil)
	ev := &jetfleetpb.JobEvent{Type: protocol.EventCancelled, JobId: t.jobID, Queue: job.Queue, Kind: job.Kind,
		Time: timestampNow(s.clk), StreamSequence: t.seq, Delivered: delivered, Reason: protocol.ReasonCancelled,
		Error: protocol.ToValidUTF8(cancelReason(req)), ErrorCode: protocol.CodeCancelled, ScheduleId: job.ScheduleID}
	if ev.Queue == "" || ev.Kind == "" {
		ev.Queue, ev.Kind = protocol.JobSubjectTokens(m.Subject)
	}
	if !job.NominalTime.IsZero() {
		ev.NominalTime = timestamppb.New(job.NominalTime)
	}
	if t.latest != nil {
		ev.Attempt, ev.MaxAttempts, ev.Snoozes, ev.TraceId = t.latest.GetAttempt(), t.latest.GetMaxAttempts(), t.latest.GetSnoozes(), t.latest.GetTraceId()
	}
	// The event first: removed without it, the job's run would be over with
	// no outcome in its history.
	if err := s.publishJobEvent(rctx, ev, protocol.JobEventMsgID(protocol.EventCancelled, t.seq, 0)); err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "store the cancelled event of %s: %v", t.jobID, err)
	}
	if err := s.jobs.DeleteMsg(rctx, t.seq); err != nil {
		if _, gerr := s.jobs.GetMsg(rctx, t.seq); !errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return nil, internal(fmt.Errorf("delete %s %d: %w", protocol.StreamJobs, t.seq, err))
		}
	}
	s.log.Info("cancelled a job that was "+where, telemetry.LogJobID, t.jobID, telemetry.LogQueue, ev.Queue, telemetry.LogKind, ev.Kind,
		"stream_sequence", t.seq, "reason", req.Reason, "requested_by", req.RequestedBy)
	return result, nil
}

// removeDelayed ends the run of a delayed job: its cancelled event (or its
// dead letter, req.DeadLetter), then its message schedule leaves DELAYED.
// It returns nil when the schedule is gone already (it fired).
func (s *Supervisor) removeDelayed(ctx context.Context, req jetfleet.CancelRequest, d *protocol.DelayedJob) (*jetfleet.CancelResult, error) {
	rctx, cancel := s.requestCtx(ctx)
	defer cancel()
	m, err := s.delayed.GetMsg(rctx, d.Sequence)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, internal(fmt.Errorf("get %s %d: %w", protocol.StreamDelayed, d.Sequence, err))
	}
	job, _ := protocol.ParseJob(protocol.JobSubject(d.Queue, d.Kind), m.Header, nil)
	if req.DeadLetter {
		if err := s.deadLetterDelayed(rctx, req, d, m); err != nil {
			return nil, err
		}
	} else {
		ev := &jetfleetpb.JobEvent{Type: protocol.EventCancelled, JobId: d.JobID, Queue: d.Queue, Kind: d.Kind,
			Time: timestampNow(s.clk), Reason: protocol.ReasonCancelled, Error: protocol.ToValidUTF8(cancelReason(req)),
			ErrorCode: protocol.CodeCancelled, ScheduleId: job.ScheduleID}
		msgID := protocol.EventCancelled + ":" + protocol.StreamDelayed + ":" + strconv.FormatUint(d.Sequence, 10)
		if err := s.publishJobEvent(rctx, ev, msgID); err != nil {
			return nil, protocol.Errorf(protocol.CodeUnavailable, "store the cancelled event of %s: %v", d.JobID, err)
		}
	}
	if err := s.delayed.DeleteMsg(rctx, d.Sequence); err != nil {
		if _, gerr := s.delayed.GetMsg(rctx, d.Sequence); !errors.Is(gerr, jetstream.ErrMsgNotFound) {
			return nil, internal(fmt.Errorf("delete %s %d: %w", protocol.StreamDelayed, d.Sequence, err))
		}
	}
	s.log.Info("cancelled a delayed job", telemetry.LogJobID, d.JobID, telemetry.LogQueue, d.Queue, telemetry.LogKind, d.Kind,
		"process_at", d.ProcessAt, "reason", req.Reason, "requested_by", req.RequestedBy, "dead_letter", req.DeadLetter)
	return &jetfleet.CancelResult{JobID: d.JobID, Where: jetfleet.CancelDelayed}, nil
}

// deadLetterDelayed writes the dead letter (reason cancelled) and dead
// event of the delayed job d, whose DELAYED message is m. Replayed, it
// runs at once on jobs.<queue>.<kind>.
func (s *Supervisor) deadLetterDelayed(ctx context.Context, req jetfleet.CancelRequest, d *protocol.DelayedJob, m *jetstream.RawStreamMsg) error {
	header := nats.Header{}
	for k, v := range m.Header {
		if !strings.HasPrefix(k, "Nats-") {
			header[k] = v
		}
	}
	subject := protocol.JobSubject(d.Queue, d.Kind)
	job, _ := protocol.ParseJob(subject, header, m.Data)
	job.ID = d.JobID
	dl := protocol.NewDeadLetter(job, subject, header, m.Data, d.Sequence, s.clk.Now())
	dl.OriginalStream = protocol.StreamDelayed
	dl.Reason, dl.ErrorCode, dl.LastError = protocol.ReasonCancelled, protocol.CodeCancelled, protocol.ToValidUTF8(cancelReason(req))
	msg, err := protocol.DeadLetterMsg(dl)
	if err != nil {
		return internal(err)
	}
	if _, err := s.js.PublishMsg(ctx, msg); err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "store the dead letter of %s: %v", d.JobID, err)
	}
	ev := &jetfleetpb.JobEvent{Type: protocol.EventDead, JobId: d.JobID, Queue: d.Queue, Kind: d.Kind, Time: timestampNow(s.clk),
		Reason: protocol.ReasonCancelled, Error: dl.LastError, ErrorCode: protocol.CodeCancelled, ScheduleId: job.ScheduleID}
	if err := s.publishJobEvent(ctx, ev, protocol.EventDead+":"+protocol.DeadLetterMsgID(protocol.StreamDelayed, d.Sequence)); err != nil {
		return protocol.Errorf(protocol.CodeUnavailable, "store the dead event of %s: %v", d.JobID, err)
	}
	return nil
}

// scanStream reads the messages of stream on subject filter, oldest first,
// calling visit for each until it returns false or maxScan messages were
// read (JOBS is a work queue: no second consumer may read it, so it reads
// by sequence, the server finding each next message on the subject). It
// reports whether it read to the end of the stream.
func (s *Supervisor) scanStream(ctx context.Context, stream jetstream.Stream, filter string, maxScan int,
	visit func(seq uint64, subject string, h nats.Header) bool) (bool, error) {
	next := uint64(1)
	for range maxScan {
		rctx, cancel := s.requestCtx(ctx)
		m, err := stream.GetMsg(rctx, next, jetstream.WithGetMsgSubject(filter))
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if !visit(m.Sequence, m.Subject, m.Header) {
			return false, nil
		}
		next = m.Sequence + 1
	}
	return false, nil
}
