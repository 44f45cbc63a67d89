package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// execution is one delivery of a job on this agent.
type execution struct {
	agent    *Agent
	msg      *delivery
	queue    *queueState
	seq      uint64
	parsed   protocol.Job // what the subject and headers say; per-message overrides of the kind's settings
	parseErr error
	cancel   context.CancelCauseFunc
	settled  atomic.Bool
	slot     sync.Once     // gives the execution's slot back once
	done     chan struct{} // closed when the execution's goroutine is finished
	job      Job
	output   OutputTail
	// snoozes counts earlier deliveries that spent no attempt.
	snoozes uint32
	// startedEvent is set once the started event is published.
	startedEvent atomic.Bool
	// awaitsOutcome is set (by the job's goroutine) when the job's answer
	// waits for its outcome event to be stored; the confirmation, not the
	// goroutine, then gives its slot back.
	awaitsOutcome bool
	// answerSent is set by whoever sends the job's final answer after its
	// outcome: the confirmation, or a stopping agent handing it back.
	answerSent atomic.Bool

	mu           sync.Mutex
	started      time.Time
	running      bool // the handler was called
	deadline     time.Time
	attempt      int
	lastProgress time.Time // the last +WPI
	waited       bool      // a waiting event was sent (fleet-wide limit)
	result       []byte    // the handler's result (RecordResult), for the succeeded event
	// resultRefused is why the handler's latest RecordResult was refused
	// (too large): the attempt then fails even if the handler goes on to
	// return nil, since whoever reads the result (a workflow's next step)
	// would otherwise see a success without it.
	resultRefused error
	// report is the handler's latest progress report, listed in heartbeats.
	// progressSent is when the last progress event went out and
	// progressEvents how many did (the n of their message ids);
	// progressTimer sends a report that came sooner than
	// protocol.ProgressEventInterval after the last one (progressDue).
	report         progressReport
	progressSent   time.Time
	progressEvents uint64
	progressDue    bool
	progressTimer  *time.Timer
}

// progressReport is one progress report of a handler; at is zero before
// the first.
type progressReport struct {
	fraction float64
	message  string
	at       time.Time
}

// claim marks the execution settled; only the first caller acts on the
// message. It waits for a progress report being sent to go out first: a
// +WPI after a delayed NAK would replace the delay with a full AckWait.
func (ex *execution) claim() bool {
	if !ex.settled.CompareAndSwap(false, true) {
		return false
	}
	// A barrier for progressLoop and progress reports: whatever they send
	// under ex.mu goes out before the answer. A report still due is
	// dropped: the job's outcome follows, and is its status.
	ex.mu.Lock()
	if ex.progressTimer != nil {
		ex.progressTimer.Stop()
		ex.progressTimer = nil
	}
	ex.mu.Unlock()
	return true
}

func (ex *execution) inFlight() *jetfleetpb.InFlightJob {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	j := &jetfleetpb.InFlightJob{
		JobId: ex.job.ID, Queue: ex.job.Queue, Kind: ex.job.Kind, ReplySubject: ex.msg.Reply(),
		StreamSequence: ex.seq, Delivered: ex.job.Delivered, StartedAt: timestamppb.New(ex.started),
		Attempt: uint32(max(ex.attempt, 0)),
	}
	if !ex.deadline.IsZero() {
		j.Deadline = timestamppb.New(ex.deadline)
	}
	if p := ex.report; !p.at.IsZero() {
		j.Progress, j.ProgressMessage, j.ProgressAt = p.fraction, p.message, timestamppb.New(p.at)
	}
	return j
}

// process runs one delivered message through the agent's execution chain.
func (a *Agent) process(q *queueState, msg *delivery, reserved bool) {
	if msg.err != nil {
		a.logger.Error("delivered message has no ack subject; ignored", "subject", msg.Subject(), telemetry.LogError, msg.err)
		if reserved {
			a.releaseSlots(1)
		}
		return
	}
	meta := msg.ack
	parsed, parseErr := protocol.ParseJob(msg.Subject(), msg.Headers(), msg.Data())
	if parsed.ID == "" {
		parsed.ID = protocol.FallbackJobID(meta.StreamSequence)
	}
	if parsed.Queue == "" {
		parsed.Queue, parsed.Kind = q.name, protocol.InvalidToken
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	now := time.Now()
	// The execution, its job and the job's output are one allocation.
	ex := &execution{agent: a, msg: msg, queue: q, seq: meta.StreamSequence, parsed: parsed, parseErr: parseErr, cancel: cancel,
		started: now, lastProgress: now, done: make(chan struct{})}
	ex.output.init(int(a.cfg.OutputTail))
	ex.job = Job{
		ID: parsed.ID, Queue: parsed.Queue, Kind: parsed.Kind, Payload: msg.Data(), Headers: msg.Headers(),
		ScheduleID: parsed.ScheduleID, NominalTime: parsed.NominalTime, ReplayedFrom: parsed.ReplayedFrom,
		StreamSequence: meta.StreamSequence, Delivered: meta.Delivered,
		ex: ex, output: &ex.output, registered: a.kinds[parsed.Kind] != nil,
	}
	job := &ex.job
	defer close(ex.done)
	if !reserved {
		ex.slot.Do(func() {}) // no slot to give back
	}
	defer func() {
		if !ex.awaitsOutcome {
			a.freeSlot(ex)
		}
	}()
	a.track(ex)
	defer a.untrack(ex)
	a.kickHeartbeat()

	switch {
	case !reserved:
		// A late answer to a pull request counted lost: running it would
		// exceed the agent's concurrency. Hand it back at once.
		a.noSlot.Add(ctx, 1)
		ex.cancel(errNoSlot)
	case a.releasing.Load():
		// Delivered while a stopping agent hands jobs back: do not start it.
		ex.cancel(errStopping)
	}
	_ = a.execute(WithJob(ctx, job), job) // the outcome is settled inside; the error is for the middleware
}

// takeHandler waits, when the agent prefetches, until fewer than
// Concurrency handlers run, and returns what gives the turn back (once,
// however often it is called). A job pulled ahead waits here as one waiting
// for its kind's cap does: it keeps its delivery (kept alive by +WPI) and
// its slot, and its attempt has not started. It returns at once when ctx
// ends: the job is handed back or cancelled before it starts. A job whose
// turn comes once a stopping agent hands its jobs back does not start
// either: the handler whose end gave it the turn may have been handed back
// before it.
func (a *Agent) takeHandler(ctx context.Context, ex *execution) (release func()) {
	if a.handlers == nil {
		return func() {}
	}
	select {
	case a.handlers <- struct{}{}:
	case <-ctx.Done():
		return func() {}
	}
	if a.releasing.Load() {
		ex.cancel(errStopping)
	}
	released := false
	return func() {
		if !released {
			released = true
			<-a.handlers
		}
	}
}

// freeSlot gives the execution's agent slot back, once.
func (a *Agent) freeSlot(ex *execution) {
	ex.slot.Do(func() { a.releaseSlots(1) })
}

// run is the innermost execution step, inside tracing, logging and metrics:
// it checks the message, reads what earlier deliveries left, runs the kind's
// handler chain and settles the outcome.
func (a *Agent) run(ctx context.Context, job *Job) error {
	ex := job.ex
	if ex.parseErr != nil {
		return a.refuse(ctx, ex, protocol.ReasonInvalidHeaders, protocol.CodeInvalidHeaders, ex.parseErr)
	}
	if a.cfg.MaxPayload > 0 && len(job.Payload) > int(a.cfg.MaxPayload) {
		return a.refuse(ctx, ex, protocol.ReasonPayloadTooLarge, protocol.CodePayloadTooLarge,
			fmt.Errorf("payload of %d bytes exceeds agent.max_payload of %d bytes", len(job.Payload), a.cfg.MaxPayload))
	}

	// A redelivery may follow an attempt whose ack was lost, a verdict whose
	// dead letter could not be stored, or snoozes that do not count as
	// attempts: the job's events about this message tell.
	var past history
	if job.Delivered > 1 {
		// Not ctx: a job handed back before it starts (its context already
		// ended) still needs its snoozes, to count one more.
		past = a.history(context.WithoutCancel(ctx), job, ex.seq)
	}
	ex.snoozes = past.snoozes
	switch {
	case past.succeeded:
		return a.skipDuplicate(ctx, ex)
	case past.dead, past.cancelled:
		// The run is over (dead-lettered, or cancelled); only the TERM
		// after it was lost.
		job.outcome = protocol.EventDead
		if past.cancelled {
			job.outcome = protocol.EventCancelled
		}
		if ex.claim() {
			if err := ex.msg.TermWithReason("run already over: " + job.outcome); err != nil {
				a.logger.Warn("term failed; JetStream delivers the job again", telemetry.LogJobID, job.ID, telemetry.LogError, err)
			}
		}
		return nil
	case past.verdict != nil:
		// An earlier delivery decided the job is dead; only its dead letter
		// is missing. Store it without running the job again.
		v := past.verdict
		job.Attempt, job.MaxAttempts = int(v.GetAttempt()), int(v.GetMaxAttempts())
		err := errors.New(v.GetError())
		if ex.claim() {
			job.outcome, job.errorCode = v.GetType(), v.GetErrorCode()
			a.deadLetter(ctx, ex, verdict{action: actDeadLetter, reason: v.GetReason(), code: v.GetErrorCode(), event: v.GetType()}, err, 0)
		}
		return err
	}

	if c, ok := a.cancels.requested(job.ID, ex.msg.ack.Timestamp); ok {
		// Cancelled while it waited (queued, delayed, between attempts):
		// end it without running it.
		cause := &cancelCommandError{reason: c.GetReason(), deadLetter: c.GetDeadLetter()}
		if ex.claim() {
			a.settle(ctx, ex, cancelVerdict(cause.deadLetter), cause, 0)
		}
		return cause
	}
	if delayed(ex, time.Now()) {
		if ex.claim() {
			a.moveToDelayed(ctx, ex)
		}
		return nil
	}
	if !ex.parsed.ProcessAt.IsZero() && !ex.parsed.Fired && job.Delivered == 1 {
		a.logger.Info("job's process_at has passed: it runs now", telemetry.LogJobID, job.ID,
			"process_at", ex.parsed.ProcessAt.UTC().Format(time.RFC3339Nano))
	}
	if cause := context.Cause(ctx); errors.Is(cause, errReleased) {
		// Handed back before it started (after reading its snoozes: the
		// released event counts one more).
		if ex.claim() {
			a.release(ctx, ex, cause)
		}
		return cause
	}
	k := a.kinds[job.Kind]
	if k == nil {
		if other := a.fleet.confirmedRunnerOf(ctx, job.Queue, job.Kind); other != "" {
			return a.passOn(ctx, ex, other)
		}
		return a.refuse(ctx, ex, protocol.ReasonUnknownKind, protocol.CodeUnknownKind,
			fmt.Errorf("no live agent on queue %s runs kind %s", job.Queue, job.Kind))
	}

	parsed := ex.parsed
	maxAttempts := k.retry.MaxAttempts
	if parsed.MaxAttempts > 0 {
		maxAttempts = parsed.MaxAttempts
	}
	timeout := k.timeout
	if parsed.Timeout > 0 {
		timeout = parsed.Timeout
	}
	attempt := max(int(job.Delivered)-int(ex.snoozes), 1)
	job.Attempt, job.MaxAttempts = attempt, maxAttempts
	if attempt > maxAttempts {
		lastErr := fmt.Errorf("no attempt left after %d deliveries: earlier attempts ended without an answer (agent lost or crashed)", job.Delivered)
		if past.lastError != "" {
			lastErr = fmt.Errorf("%w; last error: %s", lastErr, past.lastError)
		}
		return a.refuse(ctx, ex, protocol.ReasonMaxAttempts, protocol.CodeAgentLost, lastErr)
	}

	releaseHandler := a.takeHandler(ctx, ex)
	defer releaseHandler()
	if k.sem != nil {
		// The kind is capped: wait for its slot (the job keeps its agent slot
		// and gets progress reports meanwhile); the attempt starts after.
		select {
		case k.sem <- struct{}{}:
			defer func() { <-k.sem }()
		case <-ctx.Done():
		}
	}
	releaseLimit := func() {}
	if ctx.Err() == nil && a.limits.limited(job.Queue, job.Kind) {
		// The kind is capped across the fleet: wait for its slot and its
		// next start (limits.go); the attempt starts after.
		if release, err := a.limits.admit(ctx, job.Queue, job.Kind, job.ID, func(reason string) { a.publishWaiting(ex, reason) }); err == nil {
			releaseLimit = release
		}
	}
	start := time.Now()
	job.Deadline = start.Add(timeout)
	ex.mu.Lock()
	ex.started, ex.deadline, ex.attempt, ex.running = start, job.Deadline, attempt, true
	waited := ex.waited
	ex.mu.Unlock()
	if a.cfg.StartedEventAfter < 0 || (waited && ctx.Err() == nil) {
		// A job that waited for its kind's limit says at once that it
		// runs: its status is not left at waiting.
		a.publishStarted(ex)
	}

	var err error
	if ctx.Err() == nil {
		err = k.handler(ctx, job)
		if err == nil {
			err = ex.refusedResult()
		}
	} else {
		// Cancelled, timed out or handed back before the handler started
		// (while waiting for the kind's slot): it did not succeed.
		err = context.Cause(ctx)
	}
	releaseLimit()
	releaseHandler()
	if !a.backedUp() {
		a.freeSlot(ex) // the work is done; the next job may come while this one settles
	}
	cause := context.Cause(ctx)
	if ctx.Err() == nil {
		cause = nil
	}
	v := decide(err, attempt, maxAttempts, k.retry, func() time.Duration {
		return k.retry.backoffFor(attempt, parsed.Backoff)
	}, cause)
	if cause != nil && (err == nil || errors.Is(err, context.Canceled)) {
		err = cause // report why the context ended, not just that it did
	}
	if !ex.claim() {
		job.outcome = protocol.EventReleased
		return err
	}
	a.settle(ctx, ex, v, err, time.Since(start))
	return err
}

// event starts a job event with the fields every event has. The execution's
// attempt fields must not change meanwhile (hold ex.mu from other goroutines).
func (a *Agent) event(ex *execution, typ string) *jetfleetpb.JobEvent {
	job := &ex.job
	ev := &jetfleetpb.JobEvent{
		Type: typ, JobId: job.ID, Queue: job.Queue, Kind: job.Kind, Attempt: uint32(max(job.Attempt, 0)),
		MaxAttempts: uint32(max(job.MaxAttempts, 0)), AgentId: a.cfg.ID, Time: timestamppb.Now(),
		ScheduleId: job.ScheduleID, TraceId: job.TraceID, StreamSequence: ex.seq, Snoozes: ex.snoozes,
		Delivered: job.Delivered, StartedAt: timestamppb.New(ex.started),
	}
	if !job.NominalTime.IsZero() {
		ev.NominalTime = timestamppb.New(job.NominalTime)
	}
	return ev
}
