package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// jobRunner is a minimal agent written from docs/protocol.md with plain
// nats.go: it pulls from queue-<queue>, publishes started, runs the
// handler, then acks and publishes succeeded, or dead-letters, terminates
// and publishes failed (or cancelled) and dead. It answers cancel commands
// on its control subject.
type jobRunner struct {
	t       *testing.T
	js      jetstream.JetStream
	agentID string
	handle  func(ctx context.Context, job protocol.Job) error

	// base is the parent of every job's context; cleanup cancels it, so a
	// job delivered twice (past AckWait) or during cleanup ends too.
	base     context.Context
	stopAll  context.CancelFunc
	mu       sync.Mutex
	running  map[string]context.CancelFunc
	started  map[string]chan struct{}
	attempts map[string]int
	wg       sync.WaitGroup
}

// errRetry makes the runner publish retrying and NAK the job with delay,
// as an agent does after a failed attempt with attempts left.
type errRetry struct{ delay time.Duration }

func (e errRetry) Error() string { return "failed; retry in " + e.delay.String() }

func (f *fleet) runner(queue string, handle func(ctx context.Context, job protocol.Job) error) *jobRunner {
	t := f.t
	t.Helper()
	nc := natstest.ConnectURL(t, f.url)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	r := &jobRunner{t: t, js: js, agentID: "runner-" + nuid.Next(), handle: handle,
		running: map[string]context.CancelFunc{}, started: map[string]chan struct{}{}, attempts: map[string]int{}}
	r.base, r.stopAll = context.WithCancel(context.Background())
	sub, err := nc.Subscribe(protocol.ControlSubject(r.agentID), r.control)
	require.NoError(t, err)
	cons, err := topology.EnsureQueue(ctx(t, 10*time.Second), js, f.topo, queue)
	require.NoError(t, err)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		r.wg.Add(1)
		go r.run(msg)
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	t.Cleanup(func() {
		cc.Stop()
		<-cc.Closed()
		r.stopAll()
		r.wg.Wait()
		_ = sub.Unsubscribe()
	})
	return r
}

// startedCh is closed once the job started.
func (r *jobRunner) startedCh(jobID string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := r.started[jobID]
	if !ok {
		ch = make(chan struct{})
		r.started[jobID] = ch
	}
	return ch
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// holds reports whether the runner still holds jobID: running it, or
// settling its attempt (its event published, the ack or NAK not yet sent).
func (r *jobRunner) holds(jobID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.running[jobID]
	return ok
}

// attemptsOf counts the deliveries of jobID the runner ran.
func (r *jobRunner) attemptsOf(jobID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts[jobID]
}

func (r *jobRunner) waitStarted(jobID string) {
	r.t.Helper()
	select {
	case <-r.startedCh(jobID):
	case <-time.After(30 * time.Second):
		r.t.Fatalf("job %s did not start", jobID)
	}
}

func (r *jobRunner) run(msg jetstream.Msg) {
	defer r.wg.Done()
	meta, err := msg.Metadata()
	if err != nil {
		return
	}
	job, _ := protocol.ParseJob(msg.Subject(), msg.Headers(), msg.Data())
	if job.ID == "" {
		job.ID = protocol.FallbackJobID(meta.Sequence.Stream)
	}
	ctx, cancel := context.WithCancel(r.base)
	defer cancel()
	r.mu.Lock()
	r.running[job.ID] = cancel
	r.attempts[job.ID]++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.running, job.ID)
		r.mu.Unlock()
	}()
	seq := meta.Sequence.Stream
	r.event(job, seq, protocol.EventStarted, "")
	if ch := r.startedCh(job.ID); !isClosed(ch) { // a redelivery starts again
		close(ch)
	}
	err = r.handle(ctx, job)
	bg, done := context.WithTimeout(context.Background(), 10*time.Second)
	defer done()
	if err == nil && ctx.Err() == nil {
		if err := msg.DoubleAck(bg); err != nil {
			r.t.Errorf("ack %s: %v", job.ID, err)
			return
		}
		r.event(job, seq, protocol.EventSucceeded, "")
		return
	}
	var retry errRetry
	if errors.As(err, &retry) && ctx.Err() == nil {
		r.event(job, seq, protocol.EventRetrying, "")
		if err := msg.NakWithDelay(retry.delay); err != nil {
			r.t.Errorf("nak %s: %v", job.ID, err)
		}
		return
	}
	if ctx.Err() != nil {
		// Cancelled (docs/protocol.md §3.2): the event, then TERM; no dead letter.
		r.event(job, seq, protocol.EventCancelled, protocol.ReasonCancelled)
		_ = msg.TermWithReason(protocol.ReasonCancelled)
		return
	}
	reason, last := protocol.ReasonNonRetryable, protocol.EventFailed
	dl := &jetfleetpb.DeadLetter{JobId: job.ID, Queue: job.Queue, Kind: job.Kind, Reason: reason, Attempts: 1,
		OriginalSubject: msg.Subject(), OriginalStream: protocol.StreamJobs, OriginalSequence: seq, Payload: msg.Data(),
		FailedAt: timestamppb.Now(), AgentId: r.agentID}
	data, _ := protocol.Marshal(dl)
	letter := &nats.Msg{Subject: protocol.DLQSubject(job.Queue, job.Kind), Data: data,
		Header: nats.Header{protocol.HeaderMsgID: {"dlq:" + protocol.StreamJobs + ":" + strconv.FormatUint(seq, 10)}, protocol.HeaderDeadReason: {reason}}}
	if _, err := r.js.PublishMsg(bg, letter); err != nil {
		r.t.Errorf("dead letter %s: %v", job.ID, err)
	}
	_ = msg.TermWithReason(reason)
	r.event(job, seq, last, reason)
	r.event(job, seq, protocol.EventDead, reason)
}

func (r *jobRunner) event(job protocol.Job, seq uint64, typ, reason string) {
	ev := &jetfleetpb.JobEvent{Type: typ, JobId: job.ID, Queue: job.Queue, Kind: job.Kind, Attempt: 1, AgentId: r.agentID,
		Time: timestamppb.Now(), ScheduleId: job.ScheduleID, StreamSequence: seq, Reason: reason}
	if !job.NominalTime.IsZero() {
		ev.NominalTime = timestamppb.New(job.NominalTime)
	}
	data, err := protocol.Marshal(ev)
	require.NoError(r.t, err)
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.js.Publish(c, protocol.JobEventSubject(job.Queue, job.Kind, typ, job.ID), data); err != nil {
		r.t.Errorf("publish %s event of %s: %v", typ, job.ID, err)
	}
}

func (r *jobRunner) control(m *nats.Msg) {
	var cmd jetfleetpb.AgentCommand
	reply := &jetfleetpb.Error{}
	if err := protocol.Unmarshal(m.Data, &cmd); err != nil {
		reply = protocol.ToDoc(protocol.Errorf(protocol.CodeInvalidArgument, "%v", err))
	} else {
		r.mu.Lock()
		cancel, ok := r.running[cmd.GetJobId()]
		r.mu.Unlock()
		if ok && cmd.GetAction() == protocol.CommandCancel {
			cancel()
		} else {
			reply = protocol.ToDoc(protocol.Errorf(protocol.CodeNotFound, "job %s is not running here", cmd.GetJobId()))
		}
	}
	data, _ := protocol.Marshal(reply)
	_ = m.Respond(data)
}

// gates holds jobs until the test releases them.
type gates struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

func newGates() *gates { return &gates{m: map[string]chan struct{}{}} }

func (g *gates) of(jobID string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch, ok := g.m[jobID]
	if !ok {
		ch = make(chan struct{})
		g.m[jobID] = ch
	}
	return ch
}

func (g *gates) release(jobID string) { close(g.of(jobID)) }

// hold runs a job until it is released (success) or cancelled.
func (g *gates) hold(ctx context.Context, job protocol.Job) error {
	select {
	case <-g.of(job.ID):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// jobEvents collects job events as they are published.
type jobEvents struct {
	mu     sync.Mutex
	events []*jetfleetpb.JobEvent
	cond   chan struct{}
}

func watchJobEvents(t *testing.T, nc *nats.Conn) *jobEvents {
	t.Helper()
	e := &jobEvents{cond: make(chan struct{})}
	sub, err := nc.Subscribe(protocol.JobEventsSubjects, func(m *nats.Msg) {
		var ev jetfleetpb.JobEvent
		if protocol.Unmarshal(m.Data, &ev) != nil {
			return
		}
		e.mu.Lock()
		e.events = append(e.events, &ev)
		close(e.cond)
		e.cond = make(chan struct{})
		e.mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
	return e
}

// waitFor waits for an event of type typ about jobID and returns it.
func (e *jobEvents) waitFor(t *testing.T, jobID, typ string) *jetfleetpb.JobEvent {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		e.mu.Lock()
		for _, ev := range e.events {
			if ev.GetJobId() == jobID && ev.GetType() == typ {
				e.mu.Unlock()
				return ev
			}
		}
		cond := e.cond
		e.mu.Unlock()
		select {
		case <-cond:
		case <-deadline:
			t.Fatalf("no %s event for job %s", typ, jobID)
			return nil
		}
	}
}

// waitState waits until the stored state of schedule id satisfies ok.
func (f *fleet) waitState(t *testing.T, id string, ok func(st map[string]any) bool) {
	t.Helper()
	c := ctx(t, 30*time.Second)
	kv, err := f.js.KeyValue(c, protocol.BucketScheduleState)
	require.NoError(t, err)
	w, err := kv.Watch(c, id)
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	for {
		select {
		case kve := <-w.Updates():
			if kve == nil {
				continue
			}
			st := map[string]any{}
			if kve.Operation() == jetstream.KeyValuePut {
				require.NoError(t, json.Unmarshal(kve.Value(), &st))
			}
			if ok(st) {
				return
			}
		case <-c.Done():
			t.Fatalf("state of %s never matched", id)
		}
	}
}

var errHandler = errors.New("handler failed")
