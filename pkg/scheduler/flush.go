package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

var errNotLeader = protocol.Errorf(protocol.CodeUnavailable, "this replica is not the scheduler leader")

func ts(unix int64) *timestamppb.Timestamp { return timestamppb.New(time.Unix(unix, 0)) }

// event queues a schedule event; msgID makes it idempotent in EVENTS.
func (e *engine) event(en *entry, doc *jetfleetpb.ScheduleEvent, msgID string) {
	doc.ScheduleId = en.id
	if en.c != nil {
		doc.Queue, doc.Kind = en.c.queue, en.c.kindName
	}
	doc.Time = timestamppb.New(e.s.clk.Now())
	e.b.events = append(e.b.events, pendingEvent{en: en, subject: protocol.ScheduleEventSubject(en.id, doc.Type), msgID: msgID, doc: doc})
}

// flush publishes the batch: first every job (with Nats-Msg-Id = job id),
// then, once JetStream has stored them, the revision-checked state advance
// of every schedule involved, and only then the schedule events of the
// schedules whose state was stored. Each step is fenced by the leadership
// check, and the state write by its revision besides, so a replica that
// lost its lease (frozen, then resumed) publishes no job, state, event or
// metric of a decision it was no longer entitled to. A schedule whose fire
// could not be published keeps its old state and is tried again; one whose
// state write meets another writer's revision reloads that state.
func (e *engine) flush() {
	b := &e.b
	if len(b.touched) == 0 && len(b.events) == 0 {
		return
	}
	w := newBatchWait(e)
	defer w.stop()
	e.publishFires(w)
	now := e.s.clk.Now()
	e.writeStates(w, now)
	e.publishEvents(w)
	e.settleBatch(now)
}

// batchWait waits for the answers of one flush, all of them bounded by one
// deadline: once it passed (or the engine stops), what has not arrived yet
// is taken as unknown at once.
//
// While no answer at all arrives for resendAfter, it sends every message
// of the batch still unanswered again. A stream whose leader's node was cut
// off or killed elects another leader within seconds, and drops what is
// sent to it meanwhile without an answer: without the resend a fire would
// wait out the whole deadline (scheduler.publish_timeout) and then
// retry_delay. A copy sent again is stored at most once: fires and events
// carry a Nats-Msg-Id, and a state write its expected revision (a second
// copy meets a revision conflict, and the state is read back). Any answer
// restarts the wait, so a server that is slow but answering gets no copies.
type batchWait struct {
	ctx         context.Context
	js          jetstream.JetStream
	log         *slog.Logger
	deadline    *time.Timer
	timedOut    bool
	resendAfter time.Duration
	lastAnswer  time.Time
	sent        []*pendingPub // in the order sent; answered ones are skipped
	resends     int           // rounds of resending in this batch
}

// middleCopyRecheck is how often a wait looks at the copies of a message
// between its first and its last, which its select does not watch.
const middleCopyRecheck = 100 * time.Millisecond

// pendingPub is one message of a batch and the futures of its copies.
type pendingPub struct {
	msg      *nats.Msg
	opts     []jetstream.PublishOpt
	futures  []jetstream.PubAckFuture // the first copy, then each one sent again
	answered bool
	ack      *jetstream.PubAck
	err      error
}

func newBatchWait(e *engine) *batchWait {
	return &batchWait{ctx: e.ctx, js: e.s.js, log: e.s.log, deadline: time.NewTimer(e.s.cfg.PublishTimeout),
		resendAfter: e.s.cfg.ResendAfter, lastAnswer: time.Now()}
}

func (w *batchWait) stop() { w.deadline.Stop() }

// send publishes msg asynchronously as part of the batch.
func (w *batchWait) send(msg *nats.Msg, opts ...jetstream.PublishOpt) (*pendingPub, error) {
	f, err := w.js.PublishMsgAsync(msg, opts...)
	if err != nil {
		return nil, err
	}
	p := &pendingPub{msg: msg, opts: opts, futures: []jetstream.PubAckFuture{f}}
	w.sent = append(w.sent, p)
	return p, nil
}

// settle records p's answer.
func (w *batchWait) settle(p *pendingPub, ack *jetstream.PubAck, err error) {
	p.answered, p.ack, p.err = true, ack, err
	w.lastAnswer = time.Now()
}

// poll takes p's answer if one of its copies has one, without waiting. An
// error counts only from the last copy: an earlier copy's error (its own
// timeout) says nothing about the copy sent after it.
func (w *batchWait) poll(p *pendingPub) bool {
	if p.answered {
		return true
	}
	last := len(p.futures) - 1
	for i, f := range p.futures {
		select {
		case ack := <-f.Ok():
			w.settle(p, ack, nil)
			return true
		default:
		}
		if i == last {
			select {
			case err := <-f.Err():
				w.settle(p, nil, err)
				return true
			default:
			}
		}
	}
	return false
}

func (w *batchWait) wait(p *pendingPub) (*jetstream.PubAck, error) {
	for !w.poll(p) {
		if w.timedOut {
			return nil, jetstream.ErrAsyncPublishTimeout
		}
		first, last := p.futures[0], p.futures[len(p.futures)-1]
		stall := time.NewTimer(time.Until(w.lastAnswer.Add(w.resendAfter)))
		// The select watches the first and the last copy; a copy sent in
		// between is seen by the poll above, run again this often.
		var recheck <-chan time.Time
		if len(p.futures) > 2 {
			recheck = time.After(middleCopyRecheck)
		}
		select {
		case <-recheck:
		case ack := <-first.Ok():
			w.settle(p, ack, nil)
		case ack := <-last.Ok():
			w.settle(p, ack, nil)
		case err := <-last.Err():
			w.settle(p, nil, err)
		case <-stall.C:
			w.resendUnanswered()
		case <-w.deadline.C:
			w.timedOut = true
		case <-w.ctx.Done():
			w.timedOut = true
			stall.Stop()
			return nil, w.ctx.Err()
		}
		stall.Stop()
	}
	return p.ack, p.err
}

// resendUnanswered sends every unanswered message of the batch again and
// restarts the wait for an answer.
func (w *batchWait) resendUnanswered() {
	n := 0
	for _, p := range w.sent {
		if w.poll(p) {
			continue
		}
		f, err := w.js.PublishMsgAsync(p.msg, p.opts...)
		if err != nil {
			continue // the copies already sent may still be answered
		}
		p.futures = append(p.futures, f)
		n++
	}
	w.resends++
	if n > 0 && w.resends == 1 {
		w.log.Info("no answer from JetStream for a while (a stream electing a leader?); sending the batch's unanswered messages again",
			"messages", n, "after", w.resendAfter)
	}
	w.lastAnswer = time.Now()
}

// publishFires publishes every job of the batch (Nats-Msg-Id = job id),
// waits for JetStream to store them, and queues the fired events.
func (e *engine) publishFires(w *batchWait) {
	b, s, ctx := &e.b, e.s, e.ctx
	for _, f := range b.fires {
		if f.en.flags&flagDeleted != 0 {
			f.err = protocol.Errorf(protocol.CodeNotFound, "schedule %s was deleted", f.en.id)
			continue
		}
		if !e.leading() {
			f.err = errNotLeader
			f.en.flags |= flagFailed
			continue
		}
		msg, err := e.jobMsg(f)
		if err != nil {
			f.err = err
			f.en.flags |= flagFailed
			continue
		}
		spanCtx, span := s.tracer.Start(ctx, "scheduler.fire", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String(telemetry.LogScheduleID, f.en.id), attribute.String(telemetry.LogJobID, f.jobID),
				attribute.String("nominal_time", time.Unix(f.nominal, 0).UTC().Format(time.RFC3339)), attribute.String("source", f.source)))
		telemetry.Inject(spanCtx, msg.Header)
		f.span, f.traceID = span, telemetry.TraceID(spanCtx)
		f.sent = s.clk.Now()
		if f.future, err = w.send(msg); err != nil {
			f.err = err
			f.en.flags |= flagFailed
		}
	}
	for _, f := range b.fires {
		if f.future != nil {
			f.ack, f.err = w.wait(f.future)
		}
		if f.span != nil {
			if f.err != nil {
				f.span.RecordError(f.err)
				f.span.SetStatus(codes.Error, f.err.Error())
			} else if f.ack.Duplicate {
				f.span.SetAttributes(attribute.Bool("duplicate", true))
			}
			f.span.End()
		}
		if f.future != nil {
			f.en.noteOutcome(f, f.err)
		}
		if f.err != nil {
			f.en.flags |= flagFailed
			if !errors.Is(f.err, errNotLeader) && ctx.Err() == nil {
				s.log.Warn("fire not published; will retry", telemetry.LogScheduleID, f.en.id, telemetry.LogJobID, f.jobID, telemetry.LogError, f.err)
			}
			continue
		}
		f.outcome = "fired"
		w := f.en.work
		w.fires++
		w.lastJobID, w.lastFireNom, w.lastFiredAt = f.jobID, f.nominal, f.sent.UnixNano()
		if w.running == f.jobID && !f.en.c.workflow { // a run's start message is no job in JOBS
			w.runningSeq = f.ack.Sequence
		}
		switch f.source {
		case sourceSchedule, sourceCatchUp, sourceEvent, sourceDependency:
			s.metrics.delay.Record(ctx, f.sent.Sub(time.Unix(0, f.planned)).Seconds())
		}
		s.metrics.fires.Add(ctx, 1, sourceAttr(f.source))
		if f.ack.Duplicate {
			s.metrics.duplicates.Add(ctx, 1)
		}
		reason := f.note
		if f.source != sourceSchedule && reason == "" {
			reason = f.source
		}
		e.event(f.en, &jetfleetpb.ScheduleEvent{Type: "fired", NominalTime: ts(f.nominal), JobId: f.jobID, Reason: reason, TraceId: f.traceID},
			f.jobID+".fired")
	}

}

// writeStates sends the revision-checked state advance of every schedule
// of the batch, all in flight at once, and waits for them.
func (e *engine) writeStates(w *batchWait, now time.Time) {
	b, s, ctx := &e.b, e.s, e.ctx
	type stateWrite struct {
		en     *entry
		future *pendingPub
	}
	var writes []stateWrite
	fenced := !e.leading()
	for _, en := range b.touched {
		if fenced {
			en.flags |= flagFailed // decided by a replica that no longer leads: discard
		}
		if en.flags&(flagFailed|flagDeleted) != 0 {
			continue
		}
		data, err := json.Marshal(en.work.toState(en.id, now))
		if err == nil {
			var fut *pendingPub
			fut, err = w.send(&nats.Msg{Subject: s.stateSubject(en.id), Data: data},
				jetstream.WithExpectLastSequencePerSubject(en.stRev))
			if err == nil {
				writes = append(writes, stateWrite{en, fut})
				continue
			}
		}
		s.log.Warn("state write not sent; will retry", telemetry.LogScheduleID, en.id, telemetry.LogError, err)
		en.flags |= flagFailed
	}
	for _, sw := range writes {
		ack, err := w.wait(sw.future)
		switch {
		case err == nil:
			sw.en.rt, sw.en.stRev, sw.en.conflicts = *sw.en.work, ack.Sequence, 0
		case isRevisionConflict(err):
			sw.en.flags |= flagReload
		default:
			if ctx.Err() == nil {
				s.log.Warn("state write failed; will retry", telemetry.LogScheduleID, sw.en.id, telemetry.LogError, err)
			}
			sw.en.flags |= flagFailed
		}
	}

}

// publishEvents publishes the events (and counts the metrics) of the
// schedules whose state is stored.
func (e *engine) publishEvents(w *batchWait) {
	b, s, ctx := &e.b, e.s, e.ctx
	var events []*pendingPub
	for _, ev := range b.events {
		if ev.en.flags&(flagFailed|flagReload|flagDeleted) != 0 {
			continue
		}
		e.countEvent(ev.doc)
		data, err := protocol.Marshal(ev.doc)
		if err != nil {
			continue
		}
		m := &nats.Msg{Subject: ev.subject, Data: data, Header: nats.Header{protocol.HeaderMsgID: {ev.msgID}}}
		if fut, err := w.send(m); err == nil {
			events = append(events, fut)
		} else {
			s.log.Warn("schedule event not published", "subject", ev.subject, telemetry.LogError, err)
		}
	}
	for _, fut := range events {
		if _, err := w.wait(fut); err != nil && ctx.Err() == nil {
			s.log.Warn("schedule event not stored", telemetry.LogError, err)
		}
	}

}

// settleBatch settles every schedule of the batch and empties it.
func (e *engine) settleBatch(now time.Time) {
	b, s := &e.b, e.s
	retryAt := now.Add(s.cfg.RetryDelay).UnixNano()
	for _, en := range b.touched {
		failed, reload := en.flags&flagFailed != 0, en.flags&flagReload != 0
		en.work, en.flags = nil, en.flags&flagDeleted
		if en.flags&flagDeleted != 0 {
			continue
		}
		if reload {
			en.conflicts = min(en.conflicts+1, math.MaxUint8)
			if en.conflicts == 1 {
				s.log.Info("schedule state changed under this replica; reloading", telemetry.LogScheduleID, en.id)
			} else {
				s.log.Warn("schedule state changed under this replica again; reloading and backing off",
					telemetry.LogScheduleID, en.id, "conflicts", en.conflicts)
			}
			e.reload(en)
			if en.conflicts > 1 {
				// Another writer keeps winning, or this replica keeps
				// expecting the wrong revision: do not publish in a loop.
				en.retryAt = max(en.retryAt, now.Add(conflictBackoff(s.cfg.RetryDelay, en.conflicts)).UnixNano())
			}
		}
		if failed {
			en.retryAt = retryAt
			e.restartConsumer(en)
		}
		e.reschedule(en)
	}
	clear(b.fires)
	clear(b.events)
	clear(b.touched)
	b.fires, b.events, b.touched = b.fires[:0], b.events[:0], b.touched[:0]
}

// maxUnresolved bounds the fires of one schedule whose outcome is unknown
// that are remembered; one per nominal time of an outage is plenty.
const maxUnresolved = 256

// noteOutcome remembers a timer fire that was sent and whose outcome is
// unknown, and forgets it once JetStream answered. Only a definite answer
// settles it: stored (or a duplicate of a stored job), or refused by the
// stream. A timeout or a lost connection may have left the job stored.
func (en *entry) noteOutcome(f *fireReq, err error) {
	if f.source != sourceSchedule && f.source != sourceCatchUp {
		return
	}
	i := slices.Index(en.unresolved, f.nominal)
	var apiErr *jetstream.APIError
	definite := err == nil || errors.As(err, &apiErr) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrNoResponders)
	switch {
	case definite && i >= 0:
		en.unresolved = slices.Delete(en.unresolved, i, i+1)
	case !definite && i < 0 && len(en.unresolved) < maxUnresolved:
		en.unresolved = append(en.unresolved, f.nominal)
	}
}

// countEvent records the metrics of a skipped or missed event whose state
// is stored.
func (e *engine) countEvent(doc *jetfleetpb.ScheduleEvent) {
	switch doc.GetType() {
	case protocol.EventSkipped:
		reason := doc.GetReason()
		if strings.HasPrefix(reason, "payload_template") {
			reason = "payload_template" // the rest is the template's error
		}
		e.s.metrics.skips.Add(e.ctx, 1, reasonAttr(reason))
	case protocol.EventMissed:
		e.s.metrics.misses.Add(e.ctx, int64(doc.GetCount()), reasonAttr(doc.GetReason()))
	}
}

// reload reads en's state from the bucket after a revision conflict. It
// reads the last message on the key's subject, not the key: after a delete
// or purge the key has no value, but the marker has a sequence, and the next
// revision-checked write must expect it.
func (e *engine) reload(en *entry) {
	ctx, cancel := context.WithTimeout(e.ctx, e.s.cfg.PublishTimeout)
	defer cancel()
	m, err := e.s.stateStream.GetLastMsgForSubject(ctx, e.s.stateSubject(en.id))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		en.rt, en.stRev = en.rt.afterMarker(en.c != nil), 0 // no message on the subject at all
	case err != nil:
		e.s.log.Warn("could not reload schedule state", telemetry.LogScheduleID, en.id, telemetry.LogError, err)
		en.retryAt = e.s.clk.Now().Add(e.s.cfg.RetryDelay).UnixNano()
	case m.Header.Get(kvOperationHeader) != "":
		en.rt, en.stRev = en.rt.afterMarker(en.c != nil), m.Sequence // a delete or purge marker
	default:
		rt, derr := decodeState(m.Data)
		if derr != nil {
			e.s.log.Error("unreadable schedule state; starting over", telemetry.LogScheduleID, en.id, telemetry.LogError, derr)
			rt = newRuntime()
		}
		en.rt, en.stRev = rt, m.Sequence
	}
	e.restartConsumer(en)
}

// kvOperationHeader marks the delete ("DEL") and purge ("PURGE") markers of
// a key-value bucket.
const kvOperationHeader = "KV-Operation"

// conflictBackoff is the wait before the next write of a schedule whose
// state writes met another writer's revision conflicts times in a row: none
// after the first, then retryDelay doubling up to 32 times retryDelay.
func conflictBackoff(retryDelay time.Duration, conflicts uint8) time.Duration {
	if conflicts < 2 {
		return 0
	}
	return retryDelay << min(conflicts-2, 5)
}

func isRevisionConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// jobMsg builds the job message of a fire.
func (e *engine) jobMsg(f *fireReq) (*nats.Msg, error) {
	c := f.en.c
	job := protocol.Job{ID: f.jobID, Queue: c.queue, Kind: c.kindName, Payload: f.payload, Timeout: c.timeout,
		MaxAttempts: int(c.maxAttempts), ScheduleID: f.en.id, NominalTime: time.Unix(f.nominal, 0), Header: nats.Header{}}
	if c.backoff != "" {
		job.Header.Set(protocol.HeaderBackoff, c.backoff)
	}
	msg, err := job.Msg()
	if err == nil && c.workflow {
		// The same headers (job id as Nats-Msg-Id, schedule, nominal
		// time) on the run's start message: the supervisor starts the run
		// as this job (docs/protocol.md §8.2).
		msg.Subject = protocol.WorkflowStartSubject(c.kindName)
	}
	return msg, err
}
