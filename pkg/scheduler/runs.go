package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Runs: the overlap policies other than allow wait for a schedule's run to
// be over. The leader learns it from the events that end a run (succeeded,
// skipped_duplicate, dead: docs/protocol.md §4), each read on its own
// subject, never from a job's latest event, which a late started, a resent
// event or the supervisor's rescued can follow. A run whose job left JOBS
// without such an event within Config.LostRunGrace is abandoned, so that no
// lost event blocks a schedule for good.

// run is a schedule's run that its overlap policy waits for.
type run struct {
	jobID string
	seq   uint64 // its message in JOBS; 0 when unknown
	// queue and kind are the schedule's target, where the run's events are.
	queue, kind string
}

// Reasons of the skipped events about a run that fired but will not end.
const (
	// reasonRunLost: the run's job left JOBS and no event ended it within
	// LostRunGrace; the schedule stops waiting for it.
	reasonRunLost = "run_lost"
	// reasonCancelPrevious: cancel_previous removed the run from JOBS while
	// no agent was executing it (queued, or between attempts).
	reasonCancelPrevious = "cancel_previous"
)

// runningRuns lists the runs the overlap policies wait for.
func (e *engine) runningRuns() []run {
	var runs []run
	for _, en := range e.byID {
		if en.c != nil && en.rt.running != "" {
			runs = append(runs, run{jobID: en.rt.running, seq: en.rt.runningSeq, queue: en.c.queue, kind: en.c.kindName})
		}
	}
	return runs
}

// runOf returns the entry that waits for run runID, about JOBS message seq
// when both sides know it (0: unknown), or nil.
func (e *engine) runOf(runID string, seq uint64) *entry {
	id, ok := scheduleOfJob(runID)
	if !ok {
		return nil
	}
	en := e.byID[id]
	if en == nil || en.c == nil {
		return nil
	}
	cur := &en.rt
	if en.work != nil {
		cur = en.work
	}
	if cur.running != runID || seq != 0 && cur.runningSeq != 0 && seq != cur.runningSeq {
		return nil
	}
	return en
}

// complete records that a run is over: an event ended it, about its JOBS
// message seq (0: unknown).
func (e *engine) complete(runID string, seq uint64) {
	if en := e.runOf(runID, seq); en != nil {
		e.endRun(en, e.work(en))
	}
}

// endRun clears the run en waits for and fires what buffer_one kept.
func (e *engine) endRun(en *entry, w *schedState) {
	w.running, w.runningSeq = "", 0
	if w.buffered != 0 {
		n := w.buffered
		w.buffered = 0
		e.decide(en, w, &fireReq{nominal: n, planned: en.c.plannedAt(n), jobID: jobID(en.id, n), source: sourceBuffered})
	}
}

// abandonRun stops waiting for a run whose job left JOBS without an event
// that ends it: the run is recorded as skipped, reason run_lost.
func (e *engine) abandonRun(runID string, seq uint64) {
	en := e.runOf(runID, seq)
	if en == nil {
		return
	}
	e.s.log.Warn("the run left JOBS and no succeeded, skipped_duplicate or dead event followed; no longer waiting for it",
		telemetry.LogScheduleID, en.id, telemetry.LogJobID, runID, "grace", e.s.cfg.LostRunGrace.String())
	w := e.work(en)
	e.skipRun(en, w, runID, reasonRunLost)
	e.endRun(en, w)
}

// runRemoved records that cancel_previous deleted run runID from JOBS.
func (e *engine) runRemoved(runID string) {
	id, ok := scheduleOfJob(runID)
	if !ok {
		return
	}
	if en := e.byID[id]; en != nil && en.c != nil {
		e.skipRun(en, e.work(en), runID, reasonCancelPrevious)
	}
}

// skipRun records a skipped event about a run that fired but will not end
// normally; its nominal time is the run's, when its job id has one.
func (e *engine) skipRun(en *entry, w *schedState, runID, reason string) {
	w.skips++
	doc := &jetfleetpb.ScheduleEvent{Type: protocol.EventSkipped, JobId: runID, Reason: reason}
	if n, ok := nominalOfJob(runID); ok {
		doc.NominalTime = ts(n)
	}
	e.event(en, doc, runID+"."+reason)
}

// runStatus is what the leader found out about a run.
type runStatus uint8

const (
	runUnknown runStatus = iota // the check failed: keep what was known
	runLive                     // not over: its job is still in JOBS
	runOver                     // an event ended it
	runGone                     // its job left JOBS, and no event ended it yet
)

// goneRuns remembers since when the leader has found each run's job gone
// from JOBS without an event that ends it.
type goneRuns struct {
	mu    sync.Mutex
	since map[string]time.Time // job id → first seen gone
}

func (g *goneRuns) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.since = nil
}

// settleRuns inspects runs and returns those an event ended and those whose
// job has been gone from JOBS without such an event for LostRunGrace.
func (s *Scheduler) settleRuns(ctx context.Context, runs []run) (over, lost []run) {
	statuses := s.inspectRuns(ctx, runs)
	now := s.clk.Now()
	s.gone.mu.Lock()
	defer s.gone.mu.Unlock()
	since := make(map[string]time.Time)
	for i, r := range runs {
		switch statuses[i] {
		case runOver:
			over = append(over, r)
		case runGone:
			first, ok := s.gone.since[r.jobID]
			if !ok {
				first = now
			}
			if now.Sub(first) >= s.cfg.LostRunGrace {
				lost = append(lost, r)
				continue
			}
			since[r.jobID] = first
		case runUnknown:
			if first, ok := s.gone.since[r.jobID]; ok {
				since[r.jobID] = first
			}
		}
	}
	s.gone.since = since
	return over, lost
}

// inspectRuns checks runs, 16 at a time.
func (s *Scheduler) inspectRuns(ctx context.Context, runs []run) []runStatus {
	out := make([]runStatus, len(runs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(16, len(runs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = s.inspectRun(ctx, runs[i])
			}
		}()
	}
feed:
	for i := range runs {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return out
}

// inspectRun checks the events that end a run, then whether its job is
// still in JOBS.
func (s *Scheduler) inspectRun(ctx context.Context, r run) runStatus {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	ended, err := s.runEnded(ctx, r)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("could not read the events of a run", telemetry.LogJobID, r.jobID, telemetry.LogError, err)
		}
		return runUnknown
	}
	if ended {
		return runOver
	}
	if r.seq == 0 {
		return runLive
	}
	jobs, err := s.jobsStream(ctx)
	if err == nil {
		_, err = jobs.GetMsg(ctx, r.seq)
	}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return runGone
	case err != nil:
		if ctx.Err() == nil {
			s.log.Warn("could not look up the job of a run", telemetry.LogJobID, r.jobID, telemetry.LogError, err)
		}
		return runUnknown
	}
	return runLive
}

// runEnded reports whether an event ended run r: the last event of each type
// that ends a run, read on its own subject, when it is about r's message
// (or either side does not know the message).
func (s *Scheduler) runEnded(ctx context.Context, r run) (bool, error) {
	for _, typ := range protocol.RunEndEvents {
		m, err := s.events.GetLastMsgForSubject(ctx, protocol.JobEventSubject(r.queue, r.kind, typ, r.jobID))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, err
		}
		seq := uint64(jobRefOfEvent(m.Data).StreamSequence)
		if r.seq == 0 || seq == 0 || seq == r.seq {
			return true, nil
		}
	}
	return false, nil
}

// watchRuns checks the running runs every LostRunGrace/2 while ctx (the
// leadership) lasts.
func (s *Scheduler) watchRuns(ctx context.Context) {
	every := s.cfg.LostRunGrace / 2
	timer := s.clk.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C():
		}
		if err := s.checkRuns(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("could not check the running runs", telemetry.LogError, err)
		}
		timer.Reset(every)
	}
}

// checkRuns is one pass of watchRuns: runs that an event ended are over
// (an event the completion watch did not see), runs whose job has been gone
// from JOBS for LostRunGrace without one are abandoned.
func (s *Scheduler) checkRuns(ctx context.Context) error {
	var runs []run
	if err := s.eng.call(ctx, func(e *engine) {
		if e.leader {
			runs = e.runningRuns()
		}
	}); err != nil {
		return err
	}
	over, lost := s.settleRuns(ctx, runs)
	if len(over) == 0 && len(lost) == 0 {
		return nil
	}
	return s.eng.call(ctx, func(e *engine) {
		if !e.leader {
			return
		}
		for _, r := range over {
			e.complete(r.jobID, r.seq)
		}
		for _, r := range lost {
			e.abandonRun(r.jobID, r.seq)
		}
	})
}

// lastJobEvent returns the latest event of a job, its status.
func (s *Scheduler) lastJobEvent(ctx context.Context, jobID string) (*jetfleetpb.JobEvent, error) {
	m, err := s.events.GetLastMsgForSubject(ctx, protocol.JobEventsOfID(jobID))
	if err != nil {
		return nil, err
	}
	var ev jetfleetpb.JobEvent
	if err := protocol.Unmarshal(m.Data, &ev); err != nil {
		return nil, err
	}
	return &ev, nil
}

// cancelRun stops the previous run prev for cancel_previous (newer replaces
// it). A run an agent is executing is cancelled through that agent's
// control subject: the agent named in the run's latest event, or any live
// agent whose heartbeat lists the run. A run no agent executes — still
// queued, between attempts (retrying, snoozed, released), or held by an
// agent that is gone — is deleted from JOBS and recorded as skipped, reason
// cancel_previous, so that it does not run again beside the newer one.
func (s *Scheduler) cancelRun(prev run, newer string) {
	s.runner.Go(func(ctx context.Context) {
		// Room for an agent slow to answer to be asked again (sendCancelPatiently).
		ctx, cancel := context.WithTimeout(ctx, 3*s.cfg.PublishTimeout)
		defer cancel()
		log := s.log.With(telemetry.LogJobID, prev.jobID, "replaced_by", newer)
		if ended, err := s.runEnded(ctx, prev); err == nil && ended {
			return
		}
		st, err := s.lastJobEvent(ctx, prev.jobID)
		if err == nil && (protocol.RunOver(st.GetType()) || st.GetType() == protocol.EventFailed) {
			return // over, or ending: a dead letter and a dead event follow a failed event
		}
		// Agents that answered that they do not hold the run.
		notHolding := map[string]bool{}
		cancelAt := func(agentID string) (done bool) {
			err := s.sendCancelPatiently(ctx, agentID, prev.jobID)
			switch {
			case err == nil:
				log.Info("cancelled the previous run", telemetry.LogAgentID, agentID)
				return true
			case errors.Is(err, protocol.Code(protocol.CodeNotFound)), errors.Is(err, nats.ErrNoResponders):
				notHolding[agentID] = true // between attempts, or the agent is gone
			default:
				log.Warn("no answer to the cancel of the previous run", telemetry.LogAgentID, agentID, telemetry.LogError, err)
			}
			return false
		}
		if agentID := st.GetAgentId(); agentID != "" && cancelAt(agentID) {
			return
		}
		holders, err := s.holdersOf(ctx, prev)
		if err != nil {
			log.Warn("cannot tell whether an agent executes the previous run; leaving it", telemetry.LogError, err)
			return
		}
		for _, agentID := range holders {
			if notHolding[agentID] {
				continue // its heartbeat predates its answer
			}
			if cancelAt(agentID) {
				return
			}
			if !notHolding[agentID] {
				log.Warn("could not cancel the previous run; leaving it", telemetry.LogAgentID, agentID)
				return
			}
		}
		if prev.seq == 0 {
			log.Warn("cannot remove the previous run: its sequence in JOBS is unknown")
			return
		}
		jobs, err := s.jobsStream(ctx)
		if err == nil {
			err = jobs.DeleteMsg(ctx, prev.seq)
		}
		switch {
		case err == nil:
			log.Info("removed the previous run from JOBS: no agent was executing it")
			s.eng.send(ctx, func(e *engine) {
				if e.leader {
					e.runRemoved(prev.jobID)
				}
			})
		case errors.Is(err, jetstream.ErrMsgNotFound), errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful):
			// Gone from JOBS already: it ended meanwhile.
		default:
			log.Warn("could not remove the previous run from JOBS", telemetry.LogError, err)
		}
	})
}

// sendCancelPatiently asks again while the agent does not answer in time: a
// loaded agent's control subscription may lag behind, and giving up leaves
// the previous run where it is. An agent that answers a later try that it
// does not hold the run most likely cancelled it on an earlier try whose
// answer came too late: that counts as cancelled, so that the run is not
// also removed from JOBS and recorded as skipped.
func (s *Scheduler) sendCancelPatiently(ctx context.Context, agentID, jobID string) error {
	unanswered := false
	for {
		try, cancel := context.WithTimeout(ctx, cancelAnswerTimeout)
		err := s.sendCancel(try, agentID, jobID)
		cancel()
		switch {
		case unanswered && errors.Is(err, protocol.Code(protocol.CodeNotFound)):
			return nil
		case !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil:
			return err
		}
		unanswered = true
	}
}

// cancelAnswerTimeout bounds one wait for an agent's answer to a cancel.
const cancelAnswerTimeout = 2 * time.Second

// sendCancel asks agentID to cancel jobID (docs/protocol.md §3.6).
func (s *Scheduler) sendCancel(ctx context.Context, agentID, jobID string) error {
	cmd, err := protocol.Marshal(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: jobID,
		Reason: "cancel_previous: a newer run of the schedule started"})
	if err != nil {
		return err
	}
	reply, err := s.nc.RequestWithContext(ctx, protocol.ControlSubject(agentID), cmd)
	if err != nil {
		return err
	}
	var doc jetfleetpb.Error
	if err := protocol.Unmarshal(reply.Data, &doc); err != nil {
		return err
	}
	return protocol.FromDoc(&doc)
}

// holdersOf returns the live agents (docs/protocol.md §3.4) whose latest
// heartbeat in bucket agents lists run r.
func (s *Scheduler) holdersOf(ctx context.Context, r run) ([]string, error) {
	kv, err := s.agentsBucket(ctx)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil // no agent ever registered
	}
	if err != nil {
		return nil, err
	}
	stored, err := protocol.ReadBucket(ctx, s.js, kv, ">", false)
	if err != nil {
		return nil, err
	}
	type entry struct {
		id     string
		hb     *jetfleetpb.Heartbeat
		stored time.Time
	}
	// Freshness is judged by the server's storage times, not the agents'
	// clocks (protocol.RegistrationFresh): read every entry first.
	var entries []entry
	var newest time.Time
	for _, kve := range stored {
		var hb jetfleetpb.Heartbeat
		if protocol.Unmarshal(kve.Value(), &hb) == nil {
			entries = append(entries, entry{kve.Key(), &hb, kve.Created()})
			if kve.Created().After(newest) {
				newest = kve.Created()
			}
		}
	}
	var holders []string
	for _, e := range entries {
		if !protocol.RegistrationFresh(e.hb, e.stored, newest) {
			continue
		}
		for _, j := range e.hb.GetJobs() {
			if j.GetJobId() == r.jobID && (r.seq == 0 || j.GetStreamSequence() == 0 || j.GetStreamSequence() == r.seq) {
				holders = append(holders, e.id)
				break
			}
		}
	}
	return holders, nil
}

// jobsStream returns the JOBS stream, looked up once.
func (s *Scheduler) jobsStream(ctx context.Context) (jetstream.Stream, error) {
	s.lookupMu.Lock()
	defer s.lookupMu.Unlock()
	if s.jobs == nil {
		st, err := s.js.Stream(ctx, protocol.StreamJobs)
		if err != nil {
			return nil, err
		}
		s.jobs = st
	}
	return s.jobs, nil
}

// agentsBucket returns bucket agents, looked up once.
func (s *Scheduler) agentsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	s.lookupMu.Lock()
	defer s.lookupMu.Unlock()
	if s.agents == nil {
		kv, err := s.js.KeyValue(ctx, protocol.BucketAgents)
		if err != nil {
			return nil, err
		}
		s.agents = kv
	}
	return s.agents, nil
}
