package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// passOnDelay is how soon a job of a kind this agent does not run is offered
// again, to the agents that do.
const passOnDelay = 500 * time.Millisecond

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
	lastProgress time.Time
}

// progress reports the job in progress unless it has been answered: a +WPI
// after a delayed NAK would replace the delay with a full AckWait.
func (ex *execution) progress() error {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.settled.Load() {
		return nil
	}
	ex.lastProgress = time.Now()
	return ex.msg.InProgress()
}

// claim marks the execution settled; only the first caller acts on the
// message. It waits for a progress report being sent to go out first: a
// +WPI after a delayed NAK would replace the delay with a full AckWait.
func (ex *execution) claim() bool {
	if !ex.settled.CompareAndSwap(false, true) {
		return false
	}
	ex.mu.Lock()
	ex.mu.Unlock() //nolint:staticcheck // an empty critical section: a barrier for progressLoop
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

// freeSlot gives the execution's agent slot back, once.
func (a *Agent) freeSlot(ex *execution) {
	ex.slot.Do(func() { a.releaseSlots(1) })
}

// progressLoop tells JetStream that running jobs are still being worked
// on, once a third of their queue's AckWait has passed since the last time,
// so a job may run far longer than AckWait without being redelivered. It
// also publishes the started event of jobs running longer than
// started_event_after.
func (a *Agent) progressLoop(ctx context.Context) {
	interval := a.cfg.StartedEventAfter / 2
	for _, q := range a.queues {
		interval = min(interval, q.ackWait/6)
	}
	t := time.NewTicker(max(interval, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		a.mu.Lock()
		running := make([]*execution, 0, len(a.inflight))
		for _, ex := range a.inflight {
			running = append(running, ex)
		}
		a.mu.Unlock()
		var started []*execution
		for _, ex := range running {
			ex.mu.Lock()
			// Checked and sent under ex.mu: claim waits for it, so no
			// +WPI follows the job's answer.
			if !ex.settled.Load() && now.Sub(ex.lastProgress) >= ex.queue.ackWait/3 {
				ex.lastProgress = now
				if err := ex.msg.InProgress(); err != nil {
					a.logger.Warn("progress report failed", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
				}
			}
			if ex.running && !ex.settled.Load() && now.Sub(ex.started) >= a.cfg.StartedEventAfter && !ex.startedEvent.Load() {
				started = append(started, ex)
			}
			ex.mu.Unlock()
		}
		for _, ex := range started {
			a.publishStarted(ex)
		}
	}
}

// publishStarted publishes the started event of ex, once, unless the job
// has been answered already.
// It is published under ex.mu, which claim waits for, so it never follows
// the job's terminal event (the latest event is the job's status).
func (a *Agent) publishStarted(ex *execution) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	if ex.settled.Load() || !ex.startedEvent.CompareAndSwap(false, true) {
		return
	}
	a.recorder.event(a.event(ex, protocol.EventStarted))
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
	case past.dead:
		// The dead letter is stored; only the TERM after it was lost.
		job.outcome = protocol.EventDead
		if ex.claim() {
			if err := ex.msg.TermWithReason("dead letter already stored"); err != nil {
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
		if other := a.fleet.runnerOf(job.Queue, job.Kind); other != "" {
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

	if k.sem != nil {
		// The kind is capped: wait for its slot (the job keeps its agent slot
		// and gets progress reports meanwhile); the attempt starts after.
		select {
		case k.sem <- struct{}{}:
			defer func() { <-k.sem }()
		case <-ctx.Done():
		}
	}
	start := time.Now()
	job.Deadline = start.Add(timeout)
	ex.mu.Lock()
	ex.started, ex.deadline, ex.attempt, ex.running = start, job.Deadline, attempt, true
	ex.mu.Unlock()
	if a.cfg.StartedEventAfter < 0 {
		a.publishStarted(ex)
	}

	var err error
	if ctx.Err() == nil {
		err = k.handler(ctx, job)
	} else {
		// Cancelled, timed out or handed back before the handler started
		// (while waiting for the kind's slot): it did not succeed.
		err = context.Cause(ctx)
	}
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

// settle applies a verdict to the message and records it.
func (a *Agent) settle(ctx context.Context, ex *execution, v verdict, err error, took time.Duration) {
	job := &ex.job
	job.outcome, job.errorCode = v.event, v.code
	if v.action == actDeadLetter {
		a.deadLetter(ctx, ex, v, err, took)
		return
	}
	ev := a.event(ex, v.event)
	ev.Duration = durationpb.New(took)
	ev.OutputTail = job.output.String()
	if err != nil {
		ev.Error, ev.ErrorCode = protocol.TruncateError(err.Error()), v.code
	}

	switch v.action {
	case actAck:
		// The ack waits for the event: a job is never acked without its
		// outcome stored, and if the ack is lost, the redelivery finds
		// "succeeded" and is acked without running again.
		a.answerOnceStored(ex, ev, a.ack)
	case actRetry:
		ev.RetryIn = durationpb.New(v.delay)
		a.recorder.event(ev)
		if nakErr := ex.msg.NakWithDelay(v.delay); nakErr != nil {
			a.logger.Warn("nak failed; JetStream redelivers after AckWait", telemetry.LogJobID, job.ID, telemetry.LogError, nakErr)
		}
	case actSnooze:
		ev.RetryIn = durationpb.New(v.delay)
		a.handBack(ctx, ex, ev, v.delay)
	case actRelease:
		a.release(ctx, ex, errStopping)
	}
}

// answerOnceStored publishes ev, the outcome of ex, and sends the job's
// answer (the ack, or the TERM after its dead letter) once the server
// confirms the event is stored — pipelined: the job's goroutine does not
// wait, while the agent counts such jobs and pulls fewer once too many wait
// (see backedUp). An event that cannot be stored leaves the job unanswered
// for good: it is handed back, and its next delivery finds what did get
// stored (docs/protocol.md §3.3).
func (a *Agent) answerOnceStored(ex *execution, ev *jetfleetpb.JobEvent, answer func(*execution)) {
	ex.awaitsOutcome = true
	a.beginAwaiting(ex)
	a.recorder.eventThen(ev, func(stored bool) {
		if ex.answerSent.CompareAndSwap(false, true) {
			if stored {
				answer(ex)
			} else {
				a.logger.Warn("outcome of the job not stored; not acked, JetStream delivers it again", telemetry.LogJobID, ex.job.ID,
					"event", ev.GetType())
				if err := ex.msg.NakWithDelay(unstoredOutcomeDelay); err != nil {
					a.logger.Warn("nak failed; JetStream redelivers after AckWait", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
				}
			}
		}
		a.endAwaiting(ex)
	})
}

// unstoredOutcomeDelay is how long a job whose outcome could not be stored
// waits before its redelivery: the events stream is in trouble.
const unstoredOutcomeDelay = 5 * time.Second

// beginAwaiting counts ex among the jobs whose answer waits for their
// outcome to be stored.
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
// be stored as the agent allows: a job finishing now keeps its slot until
// its outcome is stored, so the agent pulls fewer jobs.
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

// ack acks the job's message as a request, so the server confirms it
// stored the ack (a double ack); the confirmation is checked as it arrives,
// without holding the job's goroutine (see replies).
func (a *Agent) ack(ex *execution) {
	msg := &nats.Msg{Subject: ex.msg.Reply(), Data: ackBody}
	if err := a.replies.send(msg, (*unconfirmedAck)(ex)); err != nil {
		a.logger.Warn("ack not sent; JetStream delivers the job again and the redelivery is skipped", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
	}
}

var ackBody = []byte(protocol.AckBody)

// unconfirmedAck is an execution whose ack awaits the server's confirmation.
type unconfirmedAck execution

func (u *unconfirmedAck) answered(_ []byte, err error) {
	if err != nil {
		u.agent.logger.Warn("ack not confirmed; a redelivery will be skipped", telemetry.LogJobID, u.job.ID, telemetry.LogError, err)
	}
}

// handBack returns the job to JetStream after delay without spending an
// attempt. Its event counts one more snooze and is stored before the NAK,
// so the next delivery counts attempts right.
func (a *Agent) handBack(ctx context.Context, ex *execution, ev *jetfleetpb.JobEvent, delay time.Duration) {
	ev.Snoozes = ex.snoozes + 1
	writeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.recorder.eventNow(writeCtx, ev); err != nil {
		a.logger.Warn("event not stored before hand-back; the next delivery counts an attempt", telemetry.LogJobID, ex.job.ID,
			"event", ev.GetType(), telemetry.LogError, err)
	}
	if err := ex.msg.NakWithDelay(delay); err != nil {
		a.logger.Warn("nak failed; JetStream redelivers after AckWait", telemetry.LogJobID, ex.job.ID, telemetry.LogError, err)
	}
}

// release hands a job back for immediate redelivery, without spending an
// attempt: the agent is stopping, or it had no free slot for the delivery
// (cause says which).
func (a *Agent) release(ctx context.Context, ex *execution, cause error) {
	ex.job.outcome = protocol.EventReleased
	ev := a.event(ex, protocol.EventReleased)
	ev.Reason = "agent stopping"
	if errors.Is(cause, errNoSlot) {
		ev.Reason = "no free slot on agent " + a.cfg.ID
	}
	a.handBack(ctx, ex, ev, 0)
}

// passOn hands a job of a kind this agent does not run back, for an agent
// that does.
func (a *Agent) passOn(ctx context.Context, ex *execution, other string) error {
	ex.job.outcome = protocol.EventReleased
	if !ex.claim() {
		return nil
	}
	ev := a.event(ex, protocol.EventReleased)
	ev.Reason = "kind " + ex.job.Kind + " is run by agent " + other
	a.handBack(ctx, ex, ev, passOnDelay)
	return nil
}

// skipDuplicate acks a redelivered job whose earlier attempt succeeded.
func (a *Agent) skipDuplicate(ctx context.Context, ex *execution) error {
	ex.job.outcome = protocol.EventSkippedDuplicate
	if !ex.claim() {
		return nil
	}
	ev := a.event(ex, protocol.EventSkippedDuplicate)
	ev.Reason = "an earlier delivery already succeeded"
	a.answerOnceStored(ex, ev, a.ack)
	return nil
}

// refuse dead-letters a job without running it.
func (a *Agent) refuse(ctx context.Context, ex *execution, reason, code string, err error) error {
	if !ex.claim() {
		return err
	}
	ex.job.outcome, ex.job.errorCode = protocol.EventFailed, code
	a.deadLetter(ctx, ex, verdict{action: actDeadLetter, reason: reason, code: code, event: protocol.EventFailed}, err, 0)
	return err
}

// deadLetter copies the job to the DLQ stream, then terminates it: TERM
// deletes the message from the work queue, so the copy must be stored first.
func (a *Agent) deadLetter(ctx context.Context, ex *execution, v verdict, cause error, took time.Duration) {
	job := &ex.job
	output := job.output.String()
	dl := protocol.NewDeadLetter(protocol.Job{ID: job.ID, Queue: job.Queue, Kind: job.Kind}, ex.msg.Subject(), job.Headers,
		job.Payload, ex.seq, time.Now())
	dl.Reason, dl.Attempts, dl.ErrorCode = v.reason, uint32(max(job.Attempt, int(job.Delivered)-int(ex.snoozes))), v.code
	dl.AgentId, dl.TraceId, dl.OutputTail = a.cfg.ID, job.TraceID, output
	if cause != nil {
		dl.LastError = protocol.TruncateError(cause.Error())
	}
	msg, err := protocol.DeadLetterMsg(dl)
	if err == nil {
		pubCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_, err = a.js.PublishMsg(pubCtx, msg)
		cancel()
	}
	if err != nil {
		// Without the copy the job must not be terminated. Store the
		// verdict, so the next delivery dead-letters without running the
		// job again, and try again then.
		a.logger.Error("dead letter not stored; the job will be delivered again", telemetry.LogJobID, job.ID, telemetry.LogError, err)
		verdictEv := a.event(ex, v.event)
		verdictEv.Reason, verdictEv.ErrorCode, verdictEv.Duration = v.reason, v.code, durationpb.New(took)
		if cause != nil {
			verdictEv.Error = dl.GetLastError()
		}
		writeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if werr := a.recorder.eventNow(writeCtx, verdictEv); werr != nil {
			a.logger.Warn("verdict not stored either; the next delivery runs the job again", telemetry.LogJobID, job.ID, telemetry.LogError, werr)
		}
		cancel()
		_ = ex.msg.NakWithDelay(5 * time.Second)
		return
	}
	// The dead letter is stored; its events go next, and the TERM that
	// removes the job once the dead event is stored: should the agent die
	// in between, the next delivery finds them and TERMs without running.
	for _, typ := range []string{v.event, protocol.EventDead} {
		ev := a.event(ex, typ)
		ev.Reason, ev.ErrorCode, ev.Duration, ev.OutputTail = v.reason, v.code, durationpb.New(took), output
		ev.Error = dl.GetLastError()
		if typ != protocol.EventDead {
			a.recorder.event(ev)
			continue
		}
		a.answerOnceStored(ex, ev, func(ex *execution) {
			if err := ex.msg.TermWithReason(v.reason); err != nil {
				a.logger.Warn("term failed; the supervisor dead-letters the job again with the same id", telemetry.LogJobID, job.ID, telemetry.LogError, err)
			}
		})
	}
}

// history is what a job's events say about earlier deliveries of one message.
type history struct {
	// succeeded: an earlier delivery succeeded (its ack was lost).
	succeeded bool
	// dead: the job's dead letter is stored (the TERM after it was lost).
	dead bool
	// verdict is a failed or cancelled event whose dead letter is missing.
	verdict *jetfleetpb.JobEvent
	// snoozes counts deliveries that spent no attempt.
	snoozes uint32
	// lastError of the latest failed attempt.
	lastError string
}

// historyTypes are the event types history reads: one direct get each, on
// the type's own subject, so no event arriving out of order can hide one.
var historyTypes = []string{
	protocol.EventSucceeded, protocol.EventSkippedDuplicate, protocol.EventFailed, protocol.EventCancelled,
	protocol.EventDead, protocol.EventSnoozed, protocol.EventReleased, protocol.EventRetrying,
}

// history reads the job's latest event of each kind that matters, keeping
// those about this message (seq).
func (a *Agent) history(ctx context.Context, job *Job, seq uint64) history {
	getCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	latest := make([]*jetfleetpb.JobEvent, len(historyTypes))
	var wg sync.WaitGroup
	for i, typ := range historyTypes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := a.events.GetLastMsgForSubject(getCtx, protocol.JobEventSubject(job.Queue, job.Kind, typ, job.ID))
			if err != nil {
				if !errors.Is(err, jetstream.ErrMsgNotFound) {
					a.logger.Warn("job events unreadable; treating the redelivery as new", telemetry.LogJobID, job.ID, telemetry.LogError, err)
				}
				return
			}
			var ev jetfleetpb.JobEvent
			if err := protocol.Unmarshal(m.Data, &ev); err != nil || ev.GetStreamSequence() != seq {
				return // undecodable, or about another message with the same job id
			}
			latest[i] = &ev
		}()
	}
	wg.Wait()
	var h history
	var lastFailure time.Time
	for i, ev := range latest {
		if ev == nil {
			continue
		}
		h.snoozes = max(h.snoozes, ev.GetSnoozes())
		switch historyTypes[i] {
		case protocol.EventSucceeded, protocol.EventSkippedDuplicate:
			h.succeeded = true
		case protocol.EventDead:
			h.dead = true
		case protocol.EventFailed, protocol.EventCancelled:
			if latest[slices.Index(historyTypes, protocol.EventDead)] == nil {
				h.verdict = ev
			}
		}
		if ev.GetError() != "" && ev.GetTime().AsTime().After(lastFailure) {
			lastFailure, h.lastError = ev.GetTime().AsTime(), ev.GetError()
		}
	}
	return h
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
