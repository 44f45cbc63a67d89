package agent

import (
	"context"
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
// asynchronously, so bookkeeping costs no round trip on the job's path. A
// background goroutine checks every publish ack (each times out after
// asyncTimeout) and sends a failed event again, a few times, unless a newer
// event of the same job went out meanwhile: a late resend would become the
// job's latest event and misstate its status.
type recorder struct {
	js     jetstream.JetStream
	logger *slog.Logger

	pending chan pendingEvent
	done    chan struct{}
	// inflight counts events not yet confirmed, for flush.
	inflight sync.WaitGroup

	// sendMu guards sending on pending against close.
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

type pendingEvent struct {
	msg    *nats.Msg
	future jetstream.PubAckFuture
	tries  int
	job    string // job token
	number uint64 // this event's number among the job's events
}

const (
	maxEventTries = 5
	// asyncTimeout bounds the wait for one publish ack, so a lost ack (a
	// stream leader change) cannot stall the confirmer.
	asyncTimeout = 10 * time.Second
)

func newRecorder(nc *nats.Conn, logger *slog.Logger) (*recorder, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(asyncTimeout))
	if err != nil {
		return nil, err
	}
	r := &recorder{js: js, logger: logger, pending: make(chan pendingEvent, 4096), done: make(chan struct{}),
		jobs: map[string]*jobEvents{}}
	go r.confirm()
	return r, nil
}

func eventMsg(ev *jetfleetpb.JobEvent) (*nats.Msg, error) {
	data, err := protocol.Marshal(ev)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: protocol.JobEventSubject(ev.GetQueue(), ev.GetKind(), ev.GetType(), ev.GetJobId()), Data: data}, nil
}

// event publishes a job event without waiting.
func (r *recorder) event(ev *jetfleetpb.JobEvent) {
	msg, err := eventMsg(ev)
	if err != nil {
		r.logger.Error("encode job event", telemetry.LogJobID, ev.GetJobId(), telemetry.LogError, err)
		return
	}
	job := protocol.JobToken(ev.GetJobId())
	r.publish(pendingEvent{msg: msg, job: job, number: r.next(job)})
}

// eventNow publishes a job event and waits until it is stored, for events
// the next delivery must see (a snooze changes how attempts are counted).
func (r *recorder) eventNow(ctx context.Context, ev *jetfleetpb.JobEvent) error {
	msg, err := eventMsg(ev)
	if err != nil {
		return err
	}
	e := pendingEvent{job: protocol.JobToken(ev.GetJobId())}
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
func (r *recorder) superseded(e pendingEvent) bool {
	r.seqMu.Lock()
	defer r.seqMu.Unlock()
	je := r.jobs[e.job]
	return je != nil && je.latest > e.number
}

// settle marks e done (confirmed, or given up); a job is forgotten once
// none of its events is pending.
func (r *recorder) settle(e pendingEvent) {
	r.seqMu.Lock()
	defer r.seqMu.Unlock()
	if je := r.jobs[e.job]; je != nil {
		if je.pending--; je.pending <= 0 {
			delete(r.jobs, e.job)
		}
	}
}

func (r *recorder) publish(e pendingEvent) {
	r.sendMu.RLock()
	defer r.sendMu.RUnlock()
	if r.closed {
		r.logger.Error("job event after the agent stopped; dropped", "subject", e.msg.Subject)
		r.settle(e)
		return
	}
	e.tries++
	// The client's own resend on "no responders" would bypass the check
	// for newer events: the recorder resends itself, in order.
	f, err := r.js.PublishMsgAsync(e.msg, jetstream.WithRetryAttempts(0))
	if err != nil {
		r.logger.Error("publish job event", "subject", e.msg.Subject, telemetry.LogError, err)
		r.settle(e)
		return
	}
	e.future = f
	r.inflight.Add(1)
	r.pending <- e
}

// confirm checks acks in publish order and resends failed events.
func (r *recorder) confirm() {
	defer close(r.done)
	for e := range r.pending {
		var err error
		select {
		case <-e.future.Ok():
		case err = <-e.future.Err():
		}
		switch {
		case err == nil:
			r.settle(e)
			r.inflight.Done()
		case r.superseded(e):
			r.logger.Warn("job event not stored; a newer event of the job went out, so it is not sent again",
				"subject", e.msg.Subject, telemetry.LogError, err)
			r.settle(e)
			r.inflight.Done()
		case e.tries < maxEventTries:
			r.logger.Warn("job event not stored; sending again", "subject", e.msg.Subject, "try", e.tries, telemetry.LogError, err)
			go func() {
				time.Sleep(time.Duration(e.tries) * 100 * time.Millisecond) // back off before resending
				if r.superseded(e) {
					r.settle(e)
				} else {
					r.publish(pendingEvent{msg: e.msg, tries: e.tries, job: e.job, number: e.number})
				}
				r.inflight.Done()
			}()
		default:
			r.logger.Error("job event lost after retries", "subject", e.msg.Subject, telemetry.LogError, err)
			r.settle(e)
			r.inflight.Done()
		}
	}
}

// flush waits until every event so far is confirmed or given up, or ctx ends.
func (r *recorder) flush(ctx context.Context) error {
	if waitFor(ctx, r.inflight.Wait) {
		return nil
	}
	return ctx.Err()
}

// close stops the confirmer once the events in flight are confirmed or
// timed out, waiting no longer than ctx; call after flush. Later events are
// dropped with an error log.
func (r *recorder) close(ctx context.Context) {
	r.sendMu.Lock()
	if !r.closed {
		r.closed = true
		close(r.pending)
	}
	r.sendMu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}
