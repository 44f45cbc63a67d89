package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// recorder publishes job events — a job's status is its latest event —
// without waiting, so bookkeeping costs no round trip on the job's path. It
// checks every event's publish ack as it arrives (through replies; an event
// unanswered after asyncTimeout counts as failed) and sends a failed event
// again, a few times, unless a newer event of the same job went out
// meanwhile: a late resend would become the job's latest event and misstate
// its status. Every event carries a Nats-Msg-Id of its own
// (protocol.JobEventMsgID), so a resend of an event that was stored after
// all (its answer was lost) is not stored twice. An event that still is not
// confirmed after its tries is read back before it is called lost.
//
// A caller that must not go on before the event is stored — the ack of a
// job after its outcome — passes a callback, told once whether the event
// was stored.
type recorder struct {
	js      jetstream.JetStream // for events that must be stored before the caller goes on
	replies *replies
	// batches, when the events stream takes fast batches, carries every
	// event's first try; resends go one by one through replies.
	batches *eventBatches
	logger  *slog.Logger

	// inflight counts events not yet confirmed or given up, for flush.
	inflight sync.WaitGroup

	// gate holds resends while the connection is down; stopped releases
	// them once the recorder closed and its flush ran out of time.
	gate    *connGate
	stopped chan struct{}

	// sendMu guards sending against close.
	sendMu sync.RWMutex
	closed bool

	// seqMu guards counter, which numbers every event, and jobs, which
	// tracks the jobs with events not settled yet (confirmed or given up).
	seqMu   sync.Mutex
	counter uint64
	jobs    map[string]*jobEvents
}

// jobEvents is what the recorder knows of one job's events in flight.
type jobEvents struct {
	latest  uint64 // number of the job's newest event
	pending int    // events of the job not settled yet
}

// pendingEvent is one event published and not yet confirmed.
type pendingEvent struct {
	r     *recorder
	msg   *nats.Msg
	tries int
	// waits counts the tries that failed while the connection was down:
	// they do not count against maxEventTries.
	waits  int
	job    string // job token
	number uint64 // this event's number among the job's events
	// then, when set, is told once whether the event was stored.
	then func(stored bool)
}

// resendDelay is the wait before the try after try n: 100ms doubling, so
// the tries of an event span about three seconds — a reconnection.
func resendDelay(n int) time.Duration { return 100 * time.Millisecond << min(n-1, 5) }

const (
	maxEventTries = 6
	// asyncTimeout bounds the wait for the server's answer to an event or
	// an ack, so a lost answer (a stream leader change) is noticed.
	asyncTimeout = 10 * time.Second
)

func newRecorder(js jetstream.JetStream, replies *replies, gate *connGate, logger *slog.Logger) *recorder {
	return &recorder{js: js, replies: replies, gate: gate, stopped: make(chan struct{}), logger: logger, jobs: map[string]*jobEvents{}}
}

// eventMsg is the message of a job event, with its Nats-Msg-Id: msgID, or
// the one of its type and delivery (protocol.JobEventMsgID) when empty.
func eventMsg(ev *jetfleetpb.JobEvent, msgID string) (*nats.Msg, error) {
	data, err := protocol.Marshal(ev)
	if err != nil {
		return nil, err
	}
	msg := &nats.Msg{Subject: protocol.JobEventSubject(ev.GetQueue(), ev.GetKind(), ev.GetType(), ev.GetJobId()), Data: data}
	if msgID == "" {
		msgID = protocol.JobEventMsgID(ev.GetType(), ev.GetStreamSequence(), ev.GetDelivered())
	}
	if msgID != "" {
		msg.Header = nats.Header{protocol.HeaderMsgID: {msgID}}
	}
	return msg, nil
}

// event publishes a job event without waiting.
func (r *recorder) event(ev *jetfleetpb.JobEvent) { r.eventThen(ev, nil) }

// eventWithID publishes a job event with its own Nats-Msg-Id (progress
// events: one per report) without waiting.
func (r *recorder) eventWithID(ev *jetfleetpb.JobEvent, msgID string) { r.publishEvent(ev, msgID, nil) }

// eventThen publishes a job event without waiting; then, when set, is told
// once whether it was stored (false: it could not be, or a newer event of
// the job superseded it).
func (r *recorder) eventThen(ev *jetfleetpb.JobEvent, then func(stored bool)) {
	r.publishEvent(ev, "", then)
}

func (r *recorder) publishEvent(ev *jetfleetpb.JobEvent, msgID string, then func(stored bool)) {
	msg, err := eventMsg(ev, msgID)
	if err != nil {
		r.logger.Error("encode job event", telemetry.LogJobID, ev.GetJobId(), telemetry.LogError, err)
		if then != nil {
			then(false)
		}
		return
	}
	job := protocol.JobToken(ev.GetJobId())
	r.publish(&pendingEvent{r: r, msg: msg, job: job, number: r.next(job), then: then})
}

// eventNow publishes a job event and waits until it is stored, for events
// the next delivery must see (a snooze changes how attempts are counted).
func (r *recorder) eventNow(ctx context.Context, ev *jetfleetpb.JobEvent) error {
	msg, err := eventMsg(ev, "")
	if err != nil {
		return err
	}
	e := &pendingEvent{job: protocol.JobToken(ev.GetJobId())}
	e.number = r.next(e.job) // supersedes any resend still pending
	_, err = r.js.PublishMsg(ctx, msg)
	r.settle(e) // either way: the caller handles the error
	return err
}

// next numbers a new event of job.
func (r *recorder) next(job string) uint64 {
	r.seqMu.Lock()
	defer r.seqMu.Unlock()
	r.counter++
	je := r.jobs[job]
	if je == nil {
		je = &jobEvents{}
		r.jobs[job] = je
	}
	je.latest = r.counter
	je.pending++
	return r.counter
}

// superseded reports whether a newer event of e's job went out after e.
func (r *recorder) superseded(e *pendingEvent) bool {
	r.seqMu.Lock()
	defer r.seqMu.Unlock()
	je := r.jobs[e.job]
	return je != nil && je.latest > e.number
}

// settle marks e done (confirmed, or given up); a job is forgotten once
// none of its events is pending.
func (r *recorder) settle(e *pendingEvent) {
	r.seqMu.Lock()
	defer r.seqMu.Unlock()
	if je := r.jobs[e.job]; je != nil {
		if je.pending--; je.pending <= 0 {
			delete(r.jobs, e.job)
		}
	}
}

func (r *recorder) publish(e *pendingEvent) {
	r.sendMu.RLock()
	defer r.sendMu.RUnlock()
	if r.closed {
		r.logger.Error("job event after the agent stopped; dropped", "subject", e.msg.Subject)
		r.settle(e)
		e.tell(false)
		return
	}
	e.tries++
	r.inflight.Add(1)
	if e.tries == 1 && r.batches != nil && r.batches.send(e) {
		return
	}
	if err := r.replies.send(e.msg, e); err != nil {
		// Not sent (disconnected): answered retries it like a refusal.
		go e.answered(nil, err)
	}
}

// finish settles an event that needs nothing more: stored, superseded by
// a newer event of its job, or given up on.
func (e *pendingEvent) finish(stored bool) {
	e.r.settle(e)
	e.tell(stored)
	e.r.inflight.Done()
}

// tell gives the event's callback its outcome.
func (e *pendingEvent) tell(stored bool) {
	if e.then != nil {
		e.then(stored)
	}
}

// answered checks the event's publish ack and sends a failed event again.
func (e *pendingEvent) answered(body []byte, err error) {
	r := e.r
	if err == nil {
		err = pubAckError(body)
	}
	switch {
	case err == nil:
		e.finish(true)
	case r.superseded(e):
		r.logger.Warn("job event not stored; a newer event of the job went out, so it is not sent again",
			"subject", e.msg.Subject, telemetry.LogError, err)
		e.finish(false)
	case !r.gate.connected():
		// Disconnected: send it again once the connection is back, however
		// long that takes (the outcome's ack waits for it), without
		// spending a try.
		if e.waits++; e.waits == 1 {
			r.logger.Warn("job event not stored while disconnected; sending it again once reconnected", "subject", e.msg.Subject,
				telemetry.LogError, err)
		}
		go func() {
			if r.gate.waitConnected(r.stopped) && !r.superseded(e) {
				r.publish(e)
			} else {
				r.logger.Error("job event not stored: the connection did not come back before the agent stopped", "subject", e.msg.Subject)
				r.settle(e)
				e.tell(false)
			}
			r.inflight.Done()
		}()
	case e.tries-e.waits < maxEventTries:
		level := slog.LevelWarn
		if errors.Is(err, errBatchNotStored) {
			level = slog.LevelDebug // the batch's end was logged once for all its events
		}
		r.logger.Log(context.Background(), level, "job event not stored; sending again", "subject", e.msg.Subject, "try", e.tries, telemetry.LogError, err)
		go func() {
			time.Sleep(resendDelay(e.tries)) // back off before resending
			if r.superseded(e) {
				r.settle(e)
				e.tell(false)
			} else {
				r.publish(e)
			}
			r.inflight.Done()
		}()
	case r.readBack(e):
		r.logger.Info("job event stored although its answers were lost (read back)", "subject", e.msg.Subject, "tries", e.tries)
		e.finish(true)
	default:
		r.logger.Error("job event not stored after retries", "subject", e.msg.Subject, "tries", e.tries, telemetry.LogError, err)
		e.finish(false)
	}
}

// readBack reports whether e is stored after all: the last event on its
// subject carries its message id.
func (r *recorder) readBack(e *pendingEvent) bool {
	id := e.msg.Header.Get(protocol.HeaderMsgID)
	if id == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), asyncTimeout)
	defer cancel()
	// From the leader: a replica behind would answer without the event.
	m, err := protocol.LeaderGetLast(ctx, r.js.Conn(), protocol.StreamEvents, e.msg.Subject)
	return err == nil && m.Header.Get(protocol.HeaderMsgID) == id
}

// flush waits until every event so far is confirmed or given up, or ctx ends.
func (r *recorder) flush(ctx context.Context) error {
	if r.batches != nil {
		r.batches.commitNow()
	}
	if waitFor(ctx, r.inflight.Wait) {
		return nil
	}
	return ctx.Err()
}

// close drops later events (with an error log) and waits, no longer than
// ctx, for those in flight to be confirmed or given up.
func (r *recorder) close(ctx context.Context) {
	r.sendMu.Lock()
	r.closed = true
	r.sendMu.Unlock()
	_ = r.flush(ctx)
	close(r.stopped)
	if r.batches != nil {
		r.batches.close()
	}
}
