package supervisor

import (
	"context"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// The job listing by state (jetfleet.api.supervisor.jobs.ls). Jobs still
// in JOBS (queued, delayed, running, failed) are read from the stream in
// queue order and classified by their latest event about that message and
// the heartbeats; finished runs (succeeded, dead) are read from their
// events in EVENTS, newest first. A page reads at most jobListScan
// messages; Next goes on from there.

// jobListScan bounds the messages one page reads.
const jobListScan = 5000

func (s *Supervisor) apiJobList(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.JobListRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.Limit == 0 {
		req.Limit = 50
	}
	switch req.State {
	case jetfleet.JobSucceeded, jetfleet.JobDead, jetfleet.JobCancelled:
		return s.listFinished(ctx, req)
	case jetfleet.JobRunning:
		return s.listRunning(ctx, req)
	case jetfleet.JobDelayed:
		// First the jobs in DELAYED, then the snoozed ones in JOBS; a
		// cursor with jobsCursor set goes on in JOBS.
		if req.Cursor&jobsCursor == 0 {
			res, err := s.listDelayed(ctx, req)
			if err != nil || res.Next != 0 {
				return res, err
			}
			rest := req
			rest.Cursor, rest.Limit = 0, req.Limit-len(res.Jobs)
			if rest.Limit == 0 {
				res.Next = jobsCursor
				return res, nil
			}
			more, err := s.listInJobs(ctx, rest)
			if err != nil {
				return nil, err
			}
			res.Jobs, res.Scanned = append(res.Jobs, more.Jobs...), res.Scanned+more.Scanned
			if more.Next != 0 {
				res.Next = more.Next | jobsCursor
			}
			return res, nil
		}
		req.Cursor &^= jobsCursor
		res, err := s.listInJobs(ctx, req)
		if err == nil && res.Next != 0 {
			res.Next |= jobsCursor
		}
		return res, err
	}
	return s.listInJobs(ctx, req)
}

// jobsCursor marks a cursor of the delayed listing that goes on in JOBS.
const jobsCursor = uint64(1) << 62

// listDelayed pages through the jobs waiting in DELAYED for their time.
func (s *Supervisor) listDelayed(ctx context.Context, req jetfleet.JobListRequest) (*jetfleet.JobListResponse, error) {
	res := &jetfleet.JobListResponse{Jobs: []jetfleet.JobListEntry{}}
	seq := req.Cursor + 1
	for res.Scanned < jobListScan {
		msgs, err := protocol.DirectGetBatch(ctx, s.nc, protocol.StreamDelayed,
			protocol.DirectGetRequest{Seq: seq, NextBySubject: protocol.DelayedFilter(req.Queue, req.Kind), Batch: 256})
		if err != nil {
			return res, nil //nolint:nilerr // no DELAYED stream (an older topology): nothing delayed there
		}
		for _, m := range msgs {
			seq = m.Sequence + 1
			res.Scanned++
			d := protocol.DelayedJobOf(m.Subject, m.Header.Get(protocol.HeaderNatsSchedule), m.Sequence)
			job, _ := protocol.ParseJob(protocol.JobSubject(d.Queue, d.Kind), m.Header, nil)
			if (req.ScheduleID != "" && job.ScheduleID != req.ScheduleID) || (!req.Since.IsZero() && m.Time.Before(req.Since)) ||
				(!req.Until.IsZero() && m.Time.After(req.Until)) {
				continue
			}
			res.Jobs = append(res.Jobs, jetfleet.JobListEntry{JobID: d.JobID, Queue: d.Queue, Kind: d.Kind, ScheduleID: job.ScheduleID,
				State: jetfleet.JobDelayed, EnqueuedAt: m.Time, Time: m.Time, RetryAt: d.ProcessAt})
			if len(res.Jobs) >= req.Limit {
				res.Next = m.Sequence
				return res, nil
			}
		}
		if len(msgs) < 256 {
			return res, nil
		}
	}
	res.Next = seq - 1
	return res, nil
}

// listInJobs pages through JOBS from the cursor, oldest first.
func (s *Supervisor) listInJobs(ctx context.Context, req jetfleet.JobListRequest) (*jetfleet.JobListResponse, error) {
	res := &jetfleet.JobListResponse{Jobs: []jetfleet.JobListEntry{}}
	held := s.tracker.heldSequences()
	// Every priority (jobs.<queue>.<kind> and jobs.<queue>.<kind>.high|low):
	// queue and kind are checked on each message.
	filter := protocol.JobsSubjects
	if req.Queue != "" {
		filter = protocol.QueueAllSubjects(req.Queue)
	}
	seq := req.Cursor + 1
	if req.Cursor == 0 && !req.Since.IsZero() {
		first, err := protocol.FirstSeqAt(ctx, s.nc, protocol.StreamJobs, req.Since)
		if err != nil {
			return nil, internal(err)
		}
		if first == 0 {
			return res, nil
		}
		seq = first
	}
	now := s.clk.Now()
	for res.Scanned < jobListScan {
		msgs, err := protocol.DirectGetBatch(ctx, s.nc, protocol.StreamJobs,
			protocol.DirectGetRequest{Seq: seq, NextBySubject: filter, Batch: 256})
		if err != nil {
			return nil, internal(err)
		}
		for _, m := range msgs {
			seq = m.Sequence + 1
			res.Scanned++
			if !req.Until.IsZero() && m.Time.After(req.Until) {
				return res, nil
			}
			job, _ := protocol.ParseJob(m.Subject, m.Header, nil)
			if job.ID == "" {
				job.ID = protocol.FallbackJobID(m.Sequence)
			}
			if (req.ScheduleID != "" && job.ScheduleID != req.ScheduleID) || (req.Kind != "" && job.Kind != req.Kind) {
				continue
			}
			ev, evSeq, err := protocol.LatestJobEvent(ctx, s.events, job.Queue, job.Kind, job.ID)
			if err != nil {
				return nil, internal(err)
			}
			if ev != nil && ev.GetStreamSequence() != 0 && ev.GetStreamSequence() != m.Sequence {
				ev, evSeq = nil, 0 // about an earlier message of the same job id
			}
			e := jetfleet.JobListEntry{JobID: job.ID, Queue: job.Queue, Kind: job.Kind, ScheduleID: job.ScheduleID,
				EnqueuedAt: m.Time, Time: m.Time, StreamSequence: m.Sequence}
			if ev != nil {
				fillFromEvent(&e, ev, evSeq)
			}
			e.State = classify(ev, held[m.Sequence], now, &e)
			if e.State != req.State {
				continue
			}
			res.Jobs = append(res.Jobs, e)
			if len(res.Jobs) >= req.Limit {
				res.Next = m.Sequence
				return res, nil
			}
		}
		if len(msgs) < 256 {
			return res, nil
		}
	}
	res.Next = seq - 1
	return res, nil
}

// classify says what state a message in JOBS is in, from its latest event
// about it (nil when none) and whether a live agent holds it.
func classify(ev *jetfleetpb.JobEvent, held bool, now time.Time, e *jetfleet.JobListEntry) string {
	if held {
		return jetfleet.JobRunning
	}
	if ev == nil {
		return jetfleet.JobQueued
	}
	retryAt := func() time.Time {
		if ev.GetTime() == nil || ev.GetRetryIn() == nil {
			return time.Time{}
		}
		return ev.GetTime().AsTime().Add(ev.GetRetryIn().AsDuration())
	}
	switch ev.GetType() {
	case protocol.EventStarted:
		return jetfleet.JobRunning
	case protocol.EventSnoozed:
		e.RetryAt = retryAt()
		if e.RetryAt.After(now) {
			return jetfleet.JobDelayed
		}
		return jetfleet.JobQueued
	case protocol.EventRetrying:
		e.RetryAt = retryAt()
		return jetfleet.JobFailed
	case protocol.EventTimedOut, protocol.EventFailed:
		return jetfleet.JobFailed
	case protocol.EventCancelled:
		return jetfleet.JobCancelled
	case protocol.EventSucceeded, protocol.EventSkippedDuplicate:
		return jetfleet.JobSucceeded
	case protocol.EventDead:
		return jetfleet.JobDead
	}
	return jetfleet.JobQueued // released, rescued: redelivered at once
}

func fillFromEvent(e *jetfleet.JobListEntry, ev *jetfleetpb.JobEvent, evSeq uint64) {
	e.Event, e.Attempt, e.MaxAttempts, e.AgentID = ev.GetType(), int(ev.GetAttempt()), int(ev.GetMaxAttempts()), ev.GetAgentId()
	e.Error, e.ErrorCode, e.Reason, e.TraceID, e.EventSequence = ev.GetError(), ev.GetErrorCode(), ev.GetReason(), ev.GetTraceId(), evSeq
	if ev.GetTime() != nil {
		e.Time = ev.GetTime().AsTime()
	}
	if ev.GetDuration() != nil {
		e.Duration = ev.GetDuration().AsDuration()
	}
	if e.ScheduleID == "" {
		e.ScheduleID = ev.GetScheduleId()
	}
}

// listRunning lists the jobs live agents hold.
func (s *Supervisor) listRunning(ctx context.Context, req jetfleet.JobListRequest) (*jetfleet.JobListResponse, error) {
	res := &jetfleet.JobListResponse{Jobs: []jetfleet.JobListEntry{}}
	for _, j := range s.tracker.running(s.clk.Now()) {
		res.Scanned++
		if j.StreamSequence <= req.Cursor || (req.Queue != "" && j.Queue != req.Queue) || (req.Kind != "" && j.Kind != req.Kind) ||
			(!req.Since.IsZero() && j.StartedAt.Before(req.Since)) || (!req.Until.IsZero() && j.StartedAt.After(req.Until)) {
			continue
		}
		e := jetfleet.JobListEntry{JobID: j.JobID, Queue: j.Queue, Kind: j.Kind, State: jetfleet.JobRunning, Attempt: int(j.Attempt),
			AgentID: j.AgentID, Time: j.StartedAt, StreamSequence: j.StreamSequence, Event: j.State}
		if req.ScheduleID != "" {
			ev, _, err := protocol.LatestJobEvent(ctx, s.events, j.Queue, j.Kind, j.JobID)
			if err != nil {
				return nil, internal(err)
			}
			if ev.GetScheduleId() != req.ScheduleID {
				continue
			}
			e.ScheduleID = ev.GetScheduleId()
		}
		res.Jobs = append(res.Jobs, e)
		if len(res.Jobs) >= req.Limit {
			res.Next = j.StreamSequence
			break
		}
	}
	return res, nil
}

// listFinished reads succeeded or dead events, newest first.
func (s *Supervisor) listFinished(ctx context.Context, req jetfleet.JobListRequest) (*jetfleet.JobListResponse, error) {
	res := &jetfleet.JobListResponse{Jobs: []jetfleet.JobListEntry{}}
	info, err := s.events.Info(ctx)
	if err != nil {
		return nil, internal(err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if req.Cursor > 0 {
		last = min(last, req.Cursor-1)
	}
	if !req.Since.IsZero() {
		seq, err := protocol.FirstSeqAt(ctx, s.nc, protocol.StreamEvents, req.Since)
		if err != nil {
			return nil, internal(err)
		}
		if seq == 0 {
			return res, nil
		}
		first = max(first, seq)
	}
	if !req.Until.IsZero() {
		seq, err := protocol.FirstSeqAt(ctx, s.nc, protocol.StreamEvents, req.Until)
		if err != nil {
			return nil, internal(err)
		}
		if seq > 0 {
			last = min(last, seq-1)
		}
	}
	if last < first || last == 0 {
		return res, nil
	}
	decoded := map[uint64]*jetfleetpb.JobEvent{}
	scan := protocol.BackwardScan{Stream: protocol.StreamEvents, Filter: protocol.JobEventsOfType(star(req.Queue), star(req.Kind), req.State),
		First: first, Last: last, Want: req.Limit, MaxScan: 200_000,
		Keep: func(m protocol.StoredMsg) bool {
			var ev jetfleetpb.JobEvent
			if protocol.Unmarshal(m.Data, &ev) != nil || (req.ScheduleID != "" && ev.GetScheduleId() != req.ScheduleID) {
				return false
			}
			decoded[m.Sequence] = &ev
			return true
		}}
	msgs, next, scanned, err := scan.Run(ctx, s.nc)
	if err != nil {
		return nil, internal(err)
	}
	res.Scanned, res.Next = int(scanned), next
	for _, m := range msgs {
		ev := decoded[m.Sequence]
		e := jetfleet.JobListEntry{JobID: ev.GetJobId(), Queue: ev.GetQueue(), Kind: ev.GetKind(), State: req.State,
			StreamSequence: ev.GetStreamSequence()}
		fillFromEvent(&e, ev, m.Sequence)
		res.Jobs = append(res.Jobs, e)
	}
	return res, nil
}

func star(s string) string {
	if s == "" {
		return "*"
	}
	return s
}
