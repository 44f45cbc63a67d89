// Package agentc_test builds the C agent of this directory with make and
// runs it against a real JetStream server, checking what it does through
// JetStream state and the events it publishes — the protocol of
// docs/protocol.md, spoken by a program that shares no code with ours.
package agentc_test

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func TestMain(m *testing.M) {
	natstest.VerifyNoLeaks(m)
}

// waitTimeout bounds every wait on the agent: generous, for a loaded 2-core machine.
const waitTimeout = 30 * time.Second

var build struct {
	once sync.Once
	path string
	err  error
}

// agentBinary builds the agent with make, once, and fails the test with the
// compiler's output when that is impossible (no gcc, no libnats-dev).
func agentBinary(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		dir, err := filepath.Abs(".")
		if err != nil {
			build.err = err
			return
		}
		cmd := exec.Command("make", "-C", dir)
		out, err := cmd.CombinedOutput()
		if err != nil {
			build.err = errors.New("make failed: " + err.Error() + "\n" + string(out) +
				"\nThe C agent needs make, gcc and Debian's libnats-dev (and pkgconf): apt-get install make gcc libc6-dev libnats-dev pkgconf")
			return
		}
		build.path = filepath.Join(dir, "agent-c")
	})
	if build.err != nil {
		t.Fatalf("building the C agent: %v", build.err)
	}
	return build.path
}

// fleet is a JetStream server provisioned like a jetfleet fleet, watched by the test.
type fleet struct {
	srv    *server.Server
	nc     *nats.Conn
	js     jetstream.JetStream
	events *fleettest.Events
}

func newFleet(t *testing.T, queue topology.QueueConfig) *fleet {
	t.Helper()
	srv := natstest.Server(t)
	nc, js := natstest.JetStream(t, srv)
	topo := topology.Config{Queues: map[string]topology.QueueConfig{"default": queue}}
	ctx := fleettest.Ctx(t, waitTimeout)
	require.NoError(t, topology.Ensure(ctx, js, topo))
	_, err := topology.EnsureQueue(ctx, js, topo, "default")
	require.NoError(t, err)
	return &fleet{srv: srv, nc: nc, js: js, events: fleettest.WatchJobEvents(t, nc)}
}

// agentProc is the C agent running as a subprocess.
type agentProc struct {
	id   string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
	err  error // from Wait, once done is closed
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startAgent runs the C agent with id against the fleet; it is stopped
// (SIGTERM, then SIGKILL) at the end of the test, and its log is printed
// when the test failed or runs with -v.
func (f *fleet) startAgent(t *testing.T, id string, args ...string) *agentProc {
	t.Helper()
	bin := agentBinary(t)
	p := &agentProc{id: id, out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"--server", f.srv.ClientURL(), "--id", id, "--concurrency", "4"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	require.NoError(t, p.cmd.Start())
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(waitTimeout):
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("agent %s output:\n%s", id, p.out.String())
		}
	})
	return p
}

// heartbeats collects the heartbeats of one agent.
type heartbeats struct {
	mu   sync.Mutex
	all  []*jetfleetpb.Heartbeat
	cond chan struct{}
}

func watchHeartbeats(t *testing.T, nc *nats.Conn, agentID string) *heartbeats {
	t.Helper()
	h := &heartbeats{cond: make(chan struct{})}
	sub, err := nc.Subscribe(protocol.HeartbeatSubject(agentID), func(m *nats.Msg) {
		var hb jetfleetpb.Heartbeat
		if err := protocol.Unmarshal(m.Data, &hb); err != nil {
			t.Errorf("undecodable heartbeat %s: %v", m.Data, err)
			return
		}
		h.mu.Lock()
		h.all = append(h.all, &hb)
		close(h.cond)
		h.cond = make(chan struct{})
		h.mu.Unlock()
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
	return h
}

// wait returns the first heartbeat that matches, waiting up to waitTimeout.
func (h *heartbeats) wait(t *testing.T, what string, match func(*jetfleetpb.Heartbeat) bool) *jetfleetpb.Heartbeat {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		h.mu.Lock()
		for _, hb := range h.all {
			if match(hb) {
				h.mu.Unlock()
				return hb
			}
		}
		cond, n := h.cond, len(h.all)
		h.mu.Unlock()
		select {
		case <-cond:
		case <-deadline:
			t.Fatalf("no heartbeat %s within %s (%d heartbeats seen)", what, waitTimeout, n)
		}
	}
}

// inFlight returns the job with jobID listed in hb, or nil.
func inFlight(hb *jetfleetpb.Heartbeat, jobID string) *jetfleetpb.InFlightJob {
	for _, j := range hb.GetJobs() {
		if j.GetJobId() == jobID {
			return j
		}
	}
	return nil
}

// deadLetter waits for the one dead letter of the DLQ stream and returns it with its message headers.
func (f *fleet) deadLetter(t *testing.T) (*jetfleetpb.DeadLetter, nats.Header) {
	t.Helper()
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamDLQ, 1, waitTimeout)
	letters := fleettest.DeadLetters(t, f.js)
	require.Len(t, letters, 1)
	ctx := fleettest.Ctx(t, waitTimeout)
	s, err := f.js.Stream(ctx, protocol.StreamDLQ)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(ctx, protocol.DLQSubjects)
	require.NoError(t, err)
	return letters[0], m.Header
}

func types(evs []string) string { return strings.Join(evs, ",") }

func TestEchoJobSucceeds(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	f.startAgent(t, "c-echo")

	// A plain job id, and one whose event subjects need the b64_ job token (§3.3).
	for _, id := range []string{"echo-1", "order:42/eu"} {
		seq := fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "echo", Payload: []byte(`{"hello":"world"}`)})
		ev := f.events.WaitFor(t, waitTimeout, id, protocol.EventSucceeded)
		assert.Equal(t, "default", ev.GetQueue())
		assert.Equal(t, "echo", ev.GetKind())
		assert.Equal(t, "c-echo", ev.GetAgentId())
		assert.Equal(t, uint32(1), ev.GetAttempt())
		assert.Equal(t, uint32(5), ev.GetMaxAttempts(), "the default max attempts")
		assert.Equal(t, uint64(1), ev.GetDelivered())
		assert.Equal(t, seq, ev.GetStreamSequence())
		assert.NotNil(t, ev.GetDuration())
		assert.False(t, ev.GetTime().AsTime().IsZero())
		assert.False(t, ev.GetStartedAt().AsTime().IsZero())
		assert.Equal(t, `{"payload_bytes":17}`, string(ev.GetResult()), "its result (§3.10)")

		st := fleettest.WaitLatestEvent(t, f.js, id, protocol.EventSucceeded, waitTimeout) // found by the job token Go computes
		assert.Equal(t, protocol.EventSucceeded, st.GetType(), "the latest event is the job's status")
		fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
		assert.Equal(t, protocol.EventSucceeded, types(f.events.Of(id)), "a quick job has one event")
	}
	assert.Equal(t, uint64(0), fleettest.StreamMsgs(t, f.js, protocol.StreamDLQ))
}

func TestFailingJobIsRetriedThenDeadLetteredOnce(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	f.startAgent(t, "c-fail")

	const id = "sched:nightly:1"
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "fail", Payload: []byte("boom"),
		MaxAttempts: 3, Backoff: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}})

	f.events.WaitFor(t, waitTimeout, id, protocol.EventDead)
	assert.Equal(t, "retrying,retrying,failed,dead", types(f.events.Of(id)))
	var retrying, failed, dead []*jetfleetpb.JobEvent
	for _, ev := range f.events.All() {
		switch ev.GetType() {
		case protocol.EventRetrying:
			retrying = append(retrying, ev)
		case protocol.EventFailed:
			failed = append(failed, ev)
		case protocol.EventDead:
			dead = append(dead, ev)
		}
	}
	require.Len(t, retrying, 2)
	for i, ev := range retrying {
		assert.Equal(t, uint32(i+1), ev.GetAttempt(), "attempt of retry %d", i)
		assert.Equal(t, uint64(i+1), ev.GetDelivered())
		assert.Equal(t, uint32(3), ev.GetMaxAttempts())
		assert.Equal(t, protocol.CodeHandlerError, ev.GetErrorCode())
		assert.Contains(t, ev.GetError(), "failed on purpose")
		assert.Equal(t, seq, ev.GetStreamSequence())
	}
	assert.Equal(t, 100*time.Millisecond, retrying[0].GetRetryIn().AsDuration(), "Jetfleet-Backoff, first delay")
	assert.Equal(t, 200*time.Millisecond, retrying[1].GetRetryIn().AsDuration(), "Jetfleet-Backoff, second delay")
	require.Len(t, failed, 1)
	assert.Equal(t, uint32(3), failed[0].GetAttempt())
	require.Len(t, dead, 1)
	assert.Equal(t, protocol.ReasonMaxAttempts, dead[0].GetReason())

	dl, h := f.deadLetter(t)
	assert.Equal(t, id, dl.GetJobId())
	assert.Equal(t, "default", dl.GetQueue())
	assert.Equal(t, "fail", dl.GetKind())
	assert.Equal(t, protocol.ReasonMaxAttempts, dl.GetReason())
	assert.Equal(t, uint32(3), dl.GetAttempts())
	assert.Equal(t, protocol.CodeHandlerError, dl.GetErrorCode())
	assert.Contains(t, dl.GetLastError(), "failed on purpose")
	assert.Equal(t, "jobs.default.fail", dl.GetOriginalSubject())
	assert.Equal(t, protocol.StreamJobs, dl.GetOriginalStream())
	assert.Equal(t, seq, dl.GetOriginalSequence())
	assert.Equal(t, []byte("boom"), dl.GetPayload())
	assert.Equal(t, "c-fail", dl.GetAgentId())
	assert.False(t, dl.GetFailedAt().AsTime().IsZero())
	assert.Equal(t, []string{"3"}, dl.GetHeaders()[protocol.HeaderMaxAttempts].GetValues())
	assert.Equal(t, []string{id}, dl.GetHeaders()[protocol.HeaderJobID].GetValues())
	assert.Equal(t, protocol.DeadLetterMsgID(protocol.StreamJobs, seq), h.Get(protocol.HeaderMsgID))
	assert.Equal(t, protocol.ReasonMaxAttempts, h.Get(protocol.HeaderDeadReason))
	assert.Equal(t, id, h.Get(protocol.HeaderJobID))

	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
	assert.Equal(t, uint64(1), fleettest.StreamMsgs(t, f.js, protocol.StreamDLQ), "dead-lettered once")
}

func TestHeartbeatListsInFlightJobAndProgressKeepsItAlive(t *testing.T) {
	// AckWait shorter than the job: only +WPI keeps it from being redelivered.
	f := newFleet(t, topology.QueueConfig{AckWait: 2 * time.Second})
	hbs := watchHeartbeats(t, f.nc, "c-hb")
	progress := collectMsgs(t, f.nc, protocol.JobEventsOfType("default", "sleep", protocol.EventProgress))
	a := f.startAgent(t, "c-hb", "--heartbeat", "200ms")

	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "sleep-1", Queue: "default", Kind: "sleep", Payload: []byte("4000")})
	hb := hbs.wait(t, "listing sleep-1", func(hb *jetfleetpb.Heartbeat) bool {
		j := inFlight(hb, "sleep-1")
		return j != nil && j.GetAttempt() > 0
	})
	assert.Equal(t, "c-hb", hb.GetAgentId())
	assert.True(t, strings.HasPrefix(hb.GetVersion(), "jetfleet-c/"), hb.GetVersion())
	assert.Equal(t, int64(a.cmd.Process.Pid), hb.GetPid())
	assert.NotEmpty(t, hb.GetHostname())
	assert.Equal(t, 200*time.Millisecond, hb.GetInterval().AsDuration())
	assert.Equal(t, []string{"default"}, hb.GetQueues())
	assert.Subset(t, hb.GetKinds(), []string{"echo", "fail", "sleep"})
	assert.Equal(t, int32(4), hb.GetCapacity())
	assert.False(t, hb.GetDraining())
	assert.NotZero(t, hb.GetSequence())
	assert.False(t, hb.GetStartedAt().AsTime().IsZero())
	assert.WithinDuration(t, time.Now(), hb.GetSentAt().AsTime(), 10*time.Second)

	j := inFlight(hb, "sleep-1")
	assert.Equal(t, "default", j.GetQueue())
	assert.Equal(t, "sleep", j.GetKind())
	assert.Equal(t, seq, j.GetStreamSequence())
	assert.Equal(t, uint64(1), j.GetDelivered())
	assert.Equal(t, uint32(1), j.GetAttempt())
	assert.Equal(t, 30*time.Minute, j.GetDeadline().AsTime().Sub(j.GetStartedAt().AsTime()), "the default timeout")
	ack, err := protocol.ParseAckSubject(j.GetReplySubject())
	require.NoError(t, err, "reply subject %q", j.GetReplySubject())
	assert.Equal(t, protocol.StreamJobs, ack.Stream)
	assert.Equal(t, protocol.QueueConsumer("default"), ack.Consumer)
	assert.Equal(t, seq, ack.StreamSequence)
	assert.Equal(t, uint64(1), ack.Delivered)

	later := hbs.wait(t, "after it", func(h *jetfleetpb.Heartbeat) bool { return h.GetSequence() > hb.GetSequence() })
	assert.Greater(t, later.GetSequence(), hb.GetSequence())

	// The same document is the agent's registration in bucket agents.
	kv, err := f.js.KeyValue(fleettest.Ctx(t, waitTimeout), protocol.BucketAgents)
	require.NoError(t, err)
	entry, err := kv.Get(fleettest.Ctx(t, waitTimeout), "c-hb")
	require.NoError(t, err)
	var reg jetfleetpb.Heartbeat
	require.NoError(t, protocol.Unmarshal(entry.Value(), &reg))
	assert.Equal(t, "c-hb", reg.GetAgentId())
	assert.Equal(t, []string{"default"}, reg.GetQueues())

	// The sleep kind reports its progress every second (§3.9): the
	// heartbeat lists the latest report.
	withProgress := hbs.wait(t, "with the job's progress", func(h *jetfleetpb.Heartbeat) bool {
		j := inFlight(h, "sleep-1")
		return j != nil && j.GetProgressAt() != nil
	})
	pj := inFlight(withProgress, "sleep-1")
	assert.Contains(t, []float64{0.25, 0.5, 0.75}, pj.GetProgress())
	assert.Regexp(t, `^slept [123]s of 4\.000s$`, pj.GetProgressMessage())
	assert.WithinDuration(t, time.Now(), pj.GetProgressAt().AsTime(), 10*time.Second)

	ev := f.events.WaitFor(t, waitTimeout, "sleep-1", protocol.EventSucceeded)
	assert.Equal(t, uint64(1), ev.GetDelivered(), "+WPI kept the job from being redelivered after AckWait")
	assert.GreaterOrEqual(t, ev.GetDuration().AsDuration(), 4*time.Second)
	assert.Equal(t, "started,progress,progress,progress,succeeded", types(f.events.Of("sleep-1")),
		"a job running past 1s has a started event; the sleep reports after 1s, 2s and 3s")
	sent := progress.list()
	require.Len(t, sent, 3)
	for i, m := range sent {
		assert.Equal(t, protocol.ProgressEventMsgID(seq, 1, uint64(i+1)), m.Header.Get(protocol.HeaderMsgID), "one id per report")
		var p jetfleetpb.JobEvent
		require.NoError(t, protocol.Unmarshal(m.Data, &p))
		assert.Equal(t, float64(i+1)/4, p.GetProgress())
		assert.Equal(t, fmt.Sprintf("slept %ds of 4.000s", i+1), p.GetProgressMessage())
		assert.Equal(t, uint32(1), p.GetAttempt())
		assert.Equal(t, seq, p.GetStreamSequence())
		assert.Equal(t, "c-hb", p.GetAgentId())
	}
	st := fleettest.WaitLatestEvent(t, f.js, "sleep-1", protocol.EventSucceeded, waitTimeout)
	assert.Equal(t, protocol.EventSucceeded, st.GetType(), "no progress event after the outcome")
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
}

// msgs collects core NATS messages on a subject, headers included.
type msgs struct {
	mu  sync.Mutex
	all []*nats.Msg
}

func collectMsgs(t *testing.T, nc *nats.Conn, subject string) *msgs {
	t.Helper()
	c := &msgs{}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		c.mu.Lock()
		c.all = append(c.all, m)
		c.mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return c
}

func (c *msgs) list() []*nats.Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*nats.Msg(nil), c.all...)
}

func TestUnknownKindIsPassedOnToALiveAgentElseDeadLettered(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	ctx := fleettest.Ctx(t, waitTimeout)
	kv, err := f.js.KeyValue(ctx, protocol.BucketAgents)
	require.NoError(t, err)
	// Another agent of the queue, alive, that runs kind resize.
	other, err := protocol.Marshal(&jetfleetpb.Heartbeat{AgentId: "go-resizer", Queues: []string{"default"},
		Kinds: []string{"resize"}, Interval: durationpb.New(time.Minute), SentAt: timestamppb.Now()})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "go-resizer", other)
	require.NoError(t, err)
	f.startAgent(t, "c-unknown")

	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "resize-1", Queue: "default", Kind: "resize"})
	rel := f.events.WaitFor(t, waitTimeout, "resize-1", protocol.EventReleased)
	assert.Contains(t, rel.GetReason(), "go-resizer")
	assert.Equal(t, uint32(1), rel.GetSnoozes(), "a hand-back spends no attempt")
	assert.Equal(t, seq, rel.GetStreamSequence())

	// Once no live agent runs the kind, the job is dead-lettered; the
	// hand-backs did not count as attempts.
	require.NoError(t, kv.Delete(ctx, "go-resizer"))
	f.events.WaitFor(t, waitTimeout, "resize-1", protocol.EventDead)
	dl, h := f.deadLetter(t)
	assert.Equal(t, protocol.ReasonUnknownKind, dl.GetReason())
	assert.Equal(t, protocol.CodeUnknownKind, dl.GetErrorCode())
	assert.Equal(t, uint32(1), dl.GetAttempts())
	assert.Equal(t, "resize", dl.GetKind())
	assert.Equal(t, protocol.ReasonUnknownKind, h.Get(protocol.HeaderDeadReason))
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)

	// With no other agent at all, straight to the dead-letter stream.
	f.startAgent(t, "c-unknown-2")
	fleettest.Publish(t, f.js, protocol.Job{ID: "mystery-1", Queue: "default", Kind: "no-such-kind"})
	ev := f.events.WaitFor(t, waitTimeout, "mystery-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonUnknownKind, ev.GetReason())
	assert.Equal(t, "failed,dead", types(f.events.Of("mystery-1")))
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamDLQ, 2, waitTimeout)
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
}

func TestUnreadableHeaderIsDeadLettered(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	f.startAgent(t, "c-headers")
	fleettest.Publish(t, f.js, protocol.Job{ID: "bad-1", Queue: "default", Kind: "echo",
		Header: nats.Header{protocol.HeaderTimeout: []string{"soon"}}})
	ev := f.events.WaitFor(t, waitTimeout, "bad-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonInvalidHeaders, ev.GetReason())
	dl, _ := f.deadLetter(t)
	assert.Equal(t, protocol.ReasonInvalidHeaders, dl.GetReason())
	assert.Contains(t, dl.GetLastError(), protocol.HeaderTimeout)
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
}

func TestRedeliveryOfSucceededJobIsAckedWithoutRunning(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	ctx := fleettest.Ctx(t, waitTimeout)
	// A fail job would fail if it ran. An earlier agent ran it, published
	// succeeded, and lost its ack: deliver it once, record that, NAK it.
	const id = "dup/1"
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "fail"})
	cons, err := f.js.Consumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default"))
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	msg := <-batch.Messages()
	require.NotNil(t, msg, "the job was not delivered: %v", batch.Error())
	data, err := protocol.Marshal(&jetfleetpb.JobEvent{Type: protocol.EventSucceeded, JobId: id, Queue: "default",
		Kind: "fail", Attempt: 1, MaxAttempts: 5, AgentId: "lost-agent", Time: timestamppb.Now(), StreamSequence: seq, Delivered: 1})
	require.NoError(t, err)
	_, err = f.js.Publish(ctx, protocol.JobEventSubject("default", "fail", protocol.EventSucceeded, id), data)
	require.NoError(t, err)
	require.NoError(t, msg.Nak())

	f.startAgent(t, "c-dup")
	ev := f.events.WaitFor(t, waitTimeout, id, protocol.EventSkippedDuplicate)
	assert.Equal(t, uint64(2), ev.GetDelivered())
	assert.Equal(t, seq, ev.GetStreamSequence())
	assert.Equal(t, "c-dup", ev.GetAgentId())
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
	assert.Equal(t, "succeeded,skipped_duplicate", types(f.events.Of(id)), "the job did not run again")
	assert.Equal(t, uint64(0), fleettest.StreamMsgs(t, f.js, protocol.StreamDLQ))
}

// TestCancelCommandEndsTheRunningJob: the cancel command ends a running job
// with the cancelled event and a TERM, no dead letter (§3.2, §3.6); the
// other commands are answered as §3.6 says.
func TestCancelCommandEndsTheRunningJob(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	hbs := watchHeartbeats(t, f.nc, "c-cancel")
	f.startAgent(t, "c-cancel")
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "long-1", Queue: "default", Kind: "sleep", Payload: []byte("600000")})
	hbs.wait(t, "listing long-1", func(hb *jetfleetpb.Heartbeat) bool { return inFlight(hb, "long-1") != nil })

	command := func(cmd *jetfleetpb.AgentCommand) *jetfleetpb.Error {
		t.Helper()
		data, err := protocol.Marshal(cmd)
		require.NoError(t, err)
		reply, err := f.nc.Request(protocol.ControlSubject("c-cancel"), data, waitTimeout)
		require.NoError(t, err)
		var e jetfleetpb.Error
		require.NoError(t, protocol.Unmarshal(reply.Data, &e))
		return &e
	}
	assert.Equal(t, "not_found", command(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: "nope"}).GetCode())
	unknown := command(&jetfleetpb.AgentCommand{Action: "explode", JobId: "long-1"})
	assert.Equal(t, "invalid_argument", unknown.GetCode())
	assert.Equal(t, "action", unknown.GetField())
	assert.Empty(t, command(&jetfleetpb.AgentCommand{Action: protocol.CommandPing}).GetCode(), "§3.6: ping is answered")
	assert.Empty(t, command(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: "long-1", Reason: "not needed"}).GetCode())

	ev := f.events.WaitFor(t, waitTimeout, "long-1", protocol.EventCancelled)
	assert.Equal(t, protocol.ReasonCancelled, ev.GetReason())
	assert.Equal(t, protocol.CodeCancelled, ev.GetErrorCode())
	assert.Equal(t, "cancelled by command: not needed", ev.GetError())
	assert.Equal(t, seq, ev.GetStreamSequence())
	assert.Equal(t, uint32(1), ev.GetAttempt())
	assert.NotNil(t, ev.GetDuration())
	st := fleettest.WaitLatestEvent(t, f.js, "long-1", protocol.EventCancelled, waitTimeout)
	assert.Equal(t, protocol.EventCancelled, st.GetType(), "the job's status")
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout) // +TERM
	assert.Equal(t, uint64(0), fleettest.StreamMsgs(t, f.js, protocol.StreamDLQ), "no dead letter")
	assert.NotContains(t, types(f.events.Of("long-1")), protocol.EventDead)
	assert.Equal(t, "not_found", command(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: "long-1"}).GetCode(),
		"a job that ended is no longer running")
}

// TestCancelCommandWithDeadLetter: a cancel with dead_letter dead-letters the
// running job with reason cancelled: events failed and dead (§3.2).
func TestCancelCommandWithDeadLetter(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	hbs := watchHeartbeats(t, f.nc, "c-cancel-dl")
	f.startAgent(t, "c-cancel-dl")
	fleettest.Publish(t, f.js, protocol.Job{ID: "long-2", Queue: "default", Kind: "sleep", Payload: []byte("600000")})
	hbs.wait(t, "listing long-2", func(hb *jetfleetpb.Heartbeat) bool { return inFlight(hb, "long-2") != nil })
	data, err := protocol.Marshal(&jetfleetpb.AgentCommand{Action: protocol.CommandCancel, JobId: "long-2", Reason: "wrong input",
		DeadLetter: true})
	require.NoError(t, err)
	reply, err := f.nc.Request(protocol.ControlSubject("c-cancel-dl"), data, waitTimeout)
	require.NoError(t, err)
	var e jetfleetpb.Error
	require.NoError(t, protocol.Unmarshal(reply.Data, &e))
	require.Empty(t, e.GetCode(), e.GetMessage())

	dead := f.events.WaitFor(t, waitTimeout, "long-2", protocol.EventDead)
	assert.Equal(t, protocol.ReasonCancelled, dead.GetReason())
	assert.Equal(t, protocol.CodeCancelled, dead.GetErrorCode())
	evs := f.events.Of("long-2")
	assert.Equal(t, "failed,dead", types(evs[len(evs)-2:]))
	assert.NotContains(t, types(evs), protocol.EventCancelled)
	dl, h := f.deadLetter(t)
	assert.Equal(t, protocol.ReasonCancelled, dl.GetReason())
	assert.Equal(t, protocol.CodeCancelled, dl.GetErrorCode())
	assert.Equal(t, "cancelled by command: wrong input", dl.GetLastError())
	assert.Equal(t, protocol.ReasonCancelled, h.Get(protocol.HeaderDeadReason))
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
}

// putCancel stores a JobCancel in bucket cancels, as the supervisor does for
// a job no agent runs (§3.8).
func (f *fleet) putCancel(t *testing.T, jobID, reason string, deadLetter bool) {
	t.Helper()
	ctx := fleettest.Ctx(t, waitTimeout)
	kv, err := f.js.KeyValue(ctx, protocol.BucketCancels)
	require.NoError(t, err)
	data, err := protocol.Marshal(&jetfleetpb.JobCancel{JobId: jobID, Reason: reason, DeadLetter: deadLetter,
		RequestedAt: timestamppb.Now(), RequestedBy: "test"})
	require.NoError(t, err)
	_, err = kv.Put(ctx, protocol.JobToken(jobID), data)
	require.NoError(t, err)
}

// TestJobCancelledInBucketIsNeverRun: a job with a cancel in bucket cancels,
// stored after the job, ends as cancelled — or dead-lettered, with
// dead_letter — without running (§3.8); a cancel stored before the job (its
// id enqueued again after the cancel) is about another job.
func TestJobCancelledInBucketIsNeverRun(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	// A cancel of "again-1" stored before the job: not this job.
	f.putCancel(t, "again-1", "an older job with this id", false)
	// fail jobs would fail if they ran: a retrying event.
	fleettest.Publish(t, f.js, protocol.Job{ID: "again-1", Queue: "default", Kind: "echo"})
	cancelledSeq := fleettest.Publish(t, f.js, protocol.Job{ID: "order:7", Queue: "default", Kind: "fail"}) // a b64_ token
	fleettest.Publish(t, f.js, protocol.Job{ID: "drop-1", Queue: "default", Kind: "fail"})
	f.putCancel(t, "order:7", "customer changed their mind", false)
	f.putCancel(t, "drop-1", "bad batch", true)
	f.startAgent(t, "c-bucket")

	ev := f.events.WaitFor(t, waitTimeout, "order:7", protocol.EventCancelled)
	assert.Equal(t, "cancelled by command: customer changed their mind", ev.GetError())
	assert.Equal(t, protocol.CodeCancelled, ev.GetErrorCode())
	assert.Equal(t, protocol.ReasonCancelled, ev.GetReason())
	assert.Equal(t, cancelledSeq, ev.GetStreamSequence())
	assert.Equal(t, "c-bucket", ev.GetAgentId())
	dead := f.events.WaitFor(t, waitTimeout, "drop-1", protocol.EventDead)
	assert.Equal(t, protocol.ReasonCancelled, dead.GetReason())
	f.events.WaitFor(t, waitTimeout, "again-1", protocol.EventSucceeded)

	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
	assert.Equal(t, "cancelled", types(f.events.Of("order:7")), "never run: no retrying event")
	assert.Equal(t, "failed,dead", types(f.events.Of("drop-1")), "never run, dead-lettered")
	dl, _ := f.deadLetter(t)
	assert.Equal(t, "drop-1", dl.GetJobId())
	assert.Equal(t, protocol.ReasonCancelled, dl.GetReason())
	assert.Equal(t, "cancelled by command: bad batch", dl.GetLastError())
}

// TestTimeoutCommandRetriesTheAttempt: the supervisor's timeout command
// ends the attempt as timed out (error code timeout) and the job is retried,
// not cancelled; on its last attempt it is dead-lettered with max_attempts.
func TestTimeoutCommandRetriesTheAttempt(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	hbs := watchHeartbeats(t, f.nc, "c-timeout")
	f.startAgent(t, "c-timeout")
	fleettest.Publish(t, f.js, protocol.Job{ID: "stuck-1", Queue: "default", Kind: "sleep", Payload: []byte("600000"),
		MaxAttempts: 2, Backoff: []time.Duration{10 * time.Millisecond}})
	timeOut := func(attempt uint32) {
		t.Helper()
		hbs.wait(t, fmt.Sprintf("listing attempt %d", attempt), func(hb *jetfleetpb.Heartbeat) bool {
			j := inFlight(hb, "stuck-1")
			return j != nil && j.GetAttempt() == attempt
		})
		data, err := protocol.Marshal(&jetfleetpb.AgentCommand{Action: protocol.CommandTimeout, JobId: "stuck-1", Reason: "past 1m and the grace"})
		require.NoError(t, err)
		reply, err := f.nc.Request(protocol.ControlSubject("c-timeout"), data, waitTimeout)
		require.NoError(t, err)
		var e jetfleetpb.Error
		require.NoError(t, protocol.Unmarshal(reply.Data, &e))
		require.Empty(t, e.GetCode(), "the agent accepts the timeout command: %s", e.GetMessage())
	}

	timeOut(1)
	retrying := f.events.WaitFor(t, waitTimeout, "stuck-1", protocol.EventRetrying)
	assert.Equal(t, protocol.CodeTimeout, retrying.GetErrorCode())
	assert.Contains(t, retrying.GetError(), "timed out by the supervisor: past 1m and the grace")
	assert.Equal(t, uint32(1), retrying.GetAttempt())

	timeOut(2) // the last attempt
	f.events.WaitFor(t, waitTimeout, "stuck-1", protocol.EventDead)
	dl, _ := f.deadLetter(t)
	assert.Equal(t, protocol.ReasonMaxAttempts, dl.GetReason())
	assert.NotContains(t, types(f.events.Of("stuck-1")), "cancelled")
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
}

func TestSIGTERMHandsRunningJobBackAndExitsZero(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	hbs := watchHeartbeats(t, f.nc, "c-stop-1")
	a := f.startAgent(t, "c-stop-1", "--grace", "300ms")
	const id = "job:1" // its events use a b64_ job token
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "sleep", Payload: []byte("600000")})
	hbs.wait(t, "listing the job", func(hb *jetfleetpb.Heartbeat) bool { return inFlight(hb, id) != nil })

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-a.done:
	case <-time.After(waitTimeout):
		t.Fatalf("the agent did not stop within %s of SIGTERM", waitTimeout)
	}
	require.NoError(t, a.err, "exit status after SIGTERM")
	assert.Equal(t, 0, a.cmd.ProcessState.ExitCode())

	rel := f.events.WaitFor(t, waitTimeout, id, protocol.EventReleased)
	assert.Equal(t, uint32(1), rel.GetSnoozes())
	assert.Equal(t, uint32(1), rel.GetAttempt())
	assert.Equal(t, seq, rel.GetStreamSequence())
	hbs.wait(t, "saying it is draining", func(hb *jetfleetpb.Heartbeat) bool { return hb.GetDraining() })
	assert.Equal(t, uint64(1), fleettest.StreamMsgs(t, f.js, protocol.StreamJobs), "the job waits for another agent")
	assert.Equal(t, uint64(0), fleettest.StreamMsgs(t, f.js, protocol.StreamDLQ))

	// The next agent counts the hand-back as no attempt: delivered 2,
	// attempt 1, read from its released event (§3.3).
	hbs2 := watchHeartbeats(t, f.nc, "c-stop-2")
	a2 := f.startAgent(t, "c-stop-2", "--grace", "300ms")
	hb := hbs2.wait(t, "listing the redelivered job", func(hb *jetfleetpb.Heartbeat) bool {
		j := inFlight(hb, id)
		return j != nil && j.GetAttempt() > 0
	})
	j := inFlight(hb, id)
	assert.Equal(t, uint64(2), j.GetDelivered())
	assert.Equal(t, uint32(1), j.GetAttempt())
	assert.True(t, slices.ContainsFunc(hb.GetJobs(), func(j *jetfleetpb.InFlightJob) bool { return j.GetStreamSequence() == seq }))

	// The agent that stopped deleted its registration (§3.4): a message with
	// header KV-Operation: DEL on $KV.agents.<id>.
	ctx := fleettest.Ctx(t, waitTimeout)
	kv, err := f.js.KeyValue(ctx, protocol.BucketAgents)
	require.NoError(t, err)
	_, err = kv.Get(ctx, "c-stop-1")
	assert.ErrorIs(t, err, jetstream.ErrKeyNotFound) // a deleted key reads as not found
	agents, err := f.js.Stream(ctx, "KV_"+protocol.BucketAgents)
	require.NoError(t, err)
	marker, err := agents.GetLastMsgForSubject(ctx, "$KV."+protocol.BucketAgents+".c-stop-1")
	require.NoError(t, err)
	assert.Equal(t, "DEL", marker.Header.Get("KV-Operation"))
	assert.Empty(t, marker.Data)

	// The second hand-back counts the first one too (§3.3).
	require.NoError(t, a2.cmd.Process.Signal(syscall.SIGTERM))
	rel2 := f.events.Wait(t, waitTimeout, func(ev *jetfleetpb.JobEvent) bool {
		return ev.GetJobId() == id && ev.GetType() == protocol.EventReleased && ev.GetAgentId() == "c-stop-2"
	})
	assert.Equal(t, uint32(2), rel2.GetSnoozes())
	assert.Equal(t, uint64(2), rel2.GetDelivered())
}

// deliverAndNak takes the next n deliveries of queue default, as an agent
// that died would have, lets record store events about each (by job id), and
// NAKs them for redelivery at once.
func (f *fleet) deliverAndNak(t *testing.T, n int, record func(jobID string, ack *protocol.AckSubject)) {
	t.Helper()
	ctx := fleettest.Ctx(t, waitTimeout)
	cons, err := f.js.Consumer(ctx, protocol.StreamJobs, protocol.QueueConsumer("default"))
	require.NoError(t, err)
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	got := 0
	for msg := range batch.Messages() {
		ack, err := protocol.ParseAckSubject(msg.Reply())
		require.NoError(t, err)
		record(msg.Headers().Get(protocol.HeaderJobID), &ack)
		require.NoError(t, msg.Nak())
		got++
	}
	require.Equal(t, n, got, "deliveries: %v", batch.Error())
}

// storeEvent stores a job event as an earlier delivery's agent (or the
// supervisor) would have, with its Nats-Msg-Id.
func (f *fleet) storeEvent(t *testing.T, ev *jetfleetpb.JobEvent) {
	t.Helper()
	data, err := protocol.Marshal(ev)
	require.NoError(t, err)
	msg := &nats.Msg{Subject: protocol.JobEventSubject(ev.GetQueue(), ev.GetKind(), ev.GetType(), ev.GetJobId()), Data: data,
		Header: nats.Header{protocol.HeaderMsgID: {protocol.JobEventMsgID(ev.GetType(), ev.GetStreamSequence(), ev.GetDelivered())}}}
	_, err = f.js.PublishMsg(fleettest.Ctx(t, waitTimeout), msg)
	require.NoError(t, err)
}

// TestRedeliveryReadsTheLatestEventOfEachType: a redelivery reads each event
// type on its own subject (§3.3), not the job's latest event: it counts the
// snoozes of a snoozed event that an older, late event follows; re-TERMs a
// job whose dead letter or cancelled event is stored; and dead-letters a
// stored verdict, all without running the job.
func TestRedeliveryReadsTheLatestEventOfEachType(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	snoozedSeq := fleettest.Publish(t, f.js, protocol.Job{ID: "snoozed-1", Queue: "default", Kind: "fail",
		MaxAttempts: 2, Backoff: []time.Duration{10 * time.Millisecond}})
	fleettest.Publish(t, f.js, protocol.Job{ID: "dead-1", Queue: "default", Kind: "sleep", Payload: []byte("600000")})
	fleettest.Publish(t, f.js, protocol.Job{ID: "verdict-1", Queue: "default", Kind: "sleep", Payload: []byte("600000")})
	fleettest.Publish(t, f.js, protocol.Job{ID: "cancelled-1", Queue: "default", Kind: "sleep", Payload: []byte("600000")})
	f.deliverAndNak(t, 4, func(id string, ack *protocol.AckSubject) {
		ev := func(typ string) *jetfleetpb.JobEvent {
			return &jetfleetpb.JobEvent{Type: typ, JobId: id, Queue: "default", AgentId: "lost-agent",
				Time: timestamppb.Now(), StreamSequence: ack.StreamSequence, Delivered: ack.Delivered, Attempt: 1, MaxAttempts: 5}
		}
		switch id {
		case "snoozed-1":
			// The handler snoozed; then a resend of its started event,
			// which knew no snooze yet, became the job's latest event.
			snoozed := ev(protocol.EventSnoozed)
			snoozed.Kind, snoozed.Snoozes, snoozed.MaxAttempts = "fail", 1, 2
			f.storeEvent(t, snoozed)
			started := ev(protocol.EventStarted)
			started.Kind, started.MaxAttempts = "fail", 2
			f.storeEvent(t, started)
		case "dead-1":
			dead := ev(protocol.EventDead)
			dead.Kind, dead.Reason, dead.ErrorCode, dead.Error = "sleep", protocol.ReasonNonRetryable, protocol.CodeNonRetryable, "stored before"
			f.storeEvent(t, dead)
		case "verdict-1":
			failed := ev(protocol.EventFailed)
			failed.Kind, failed.Reason, failed.ErrorCode, failed.Error = "sleep", protocol.ReasonNonRetryable, protocol.CodeNonRetryable, "bad input"
			f.storeEvent(t, failed)
		case "cancelled-1":
			// Cancelled; the TERM after the event was lost.
			cancelled := ev(protocol.EventCancelled)
			cancelled.Kind, cancelled.Reason, cancelled.ErrorCode, cancelled.Error = "sleep", protocol.ReasonCancelled, protocol.CodeCancelled, "cancelled by command"
			f.storeEvent(t, cancelled)
		default:
			t.Errorf("unexpected job %q", id)
		}
	})
	require.Equal(t, protocol.EventStarted, fleettest.LatestEvent(t, f.js, "snoozed-1").GetType())

	f.startAgent(t, "c-history")

	// snoozes 1 from the snoozed event: delivery 2 is attempt 1, not 2.
	retrying := f.events.Wait(t, waitTimeout, func(ev *jetfleetpb.JobEvent) bool {
		return ev.GetJobId() == "snoozed-1" && ev.GetAgentId() == "c-history"
	})
	assert.Equal(t, protocol.EventRetrying, retrying.GetType())
	assert.Equal(t, uint32(1), retrying.GetAttempt())
	assert.Equal(t, uint32(1), retrying.GetSnoozes())
	assert.Equal(t, uint64(2), retrying.GetDelivered())
	assert.Equal(t, snoozedSeq, retrying.GetStreamSequence())
	f.events.WaitFor(t, waitTimeout, "snoozed-1", protocol.EventDead) // attempt 2 of 2

	// The verdict is dead-lettered with its reason and error, not run.
	f.events.WaitFor(t, waitTimeout, "verdict-1", protocol.EventDead)
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout) // dead-1 TERMed
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamDLQ, 2, waitTimeout)
	byID := map[string]*jetfleetpb.DeadLetter{}
	for _, dl := range fleettest.DeadLetters(t, f.js) {
		byID[dl.GetJobId()] = dl
	}
	require.Contains(t, byID, "verdict-1")
	assert.Equal(t, protocol.ReasonNonRetryable, byID["verdict-1"].GetReason())
	assert.Equal(t, protocol.CodeNonRetryable, byID["verdict-1"].GetErrorCode())
	assert.Equal(t, "bad input", byID["verdict-1"].GetLastError())
	assert.Equal(t, "failed,dead", types(f.eventsBy("c-history", "verdict-1")), "the job did not run")
	require.Contains(t, byID, "snoozed-1")
	assert.Equal(t, protocol.ReasonMaxAttempts, byID["snoozed-1"].GetReason())
	assert.Equal(t, protocol.CodeHandlerError, byID["snoozed-1"].GetErrorCode(), "its last attempt ran")
	assert.NotContains(t, byID, "dead-1", "its dead letter was stored before: only the TERM was missing")
	assert.Empty(t, f.eventsBy("c-history", "dead-1"), "the job did not run")
	assert.NotContains(t, byID, "cancelled-1", "a cancelled job is only TERMed again, never dead-lettered")
	assert.Empty(t, f.eventsBy("c-history", "cancelled-1"), "the job did not run")
}

// TestRegistrationIsLiveByStorageTime: an agent whose registration was not
// rewritten for 3 intervals is not live, whatever its sent_at says (§3.4):
// a kind only it ran is dead-lettered, not passed on to it.
func TestRegistrationIsLiveByStorageTime(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	ctx := fleettest.Ctx(t, waitTimeout)
	kv, err := f.js.KeyValue(ctx, protocol.BucketAgents)
	require.NoError(t, err)
	// A silent agent whose clock runs an hour ahead.
	stale, err := protocol.Marshal(&jetfleetpb.Heartbeat{AgentId: "go-silent", Queues: []string{"default"},
		Kinds: []string{"resize"}, Interval: durationpb.New(time.Second), SentAt: timestamppb.New(time.Now().Add(time.Hour))})
	require.NoError(t, err)
	_, err = kv.Put(ctx, "go-silent", stale)
	require.NoError(t, err)
	silent, err := kv.Get(ctx, "go-silent")
	require.NoError(t, err)
	f.startAgent(t, "c-storage-time", "--heartbeat", "200ms")
	// Wait until the C agent rewrote its own entry 3 of go-silent's intervals later.
	w, err := kv.Watch(ctx, "c-storage-time")
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	for e := range w.Updates() {
		if e != nil && e.Created().Sub(silent.Created()) > 3*time.Second+200*time.Millisecond {
			break
		}
	}

	fleettest.Publish(t, f.js, protocol.Job{ID: "resize-2", Queue: "default", Kind: "resize"})
	ev := f.events.WaitFor(t, waitTimeout, "resize-2", protocol.EventDead)
	assert.Equal(t, protocol.ReasonUnknownKind, ev.GetReason())
	assert.Equal(t, "failed,dead", types(f.events.Of("resize-2")), "not passed on to a silent agent")
}

// TestJobIDs: a job id is up to 256 characters of letters, marks, numbers,
// punctuation and symbols, in UTF-8 (§1); an invalid Jetfleet-Job-Id is a
// header error, dead-lettered under JOBS-<stream sequence>, never under its
// Nats-Msg-Id (§2.1).
func TestJobIDs(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	f.startAgent(t, "c-ids")

	long := strings.Repeat("я", 256) // 512 bytes
	for _, id := range []string{"заказ-№42", long} {
		fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "echo"})
		f.events.WaitFor(t, waitTimeout, id, protocol.EventSucceeded)
	}

	for i, bad := range []string{"has space", "no\u00a0break", strings.Repeat("я", 257), "zero\u200bwidth"} {
		seq := fleettest.Publish(t, f.js, protocol.Job{Queue: "default", Kind: "echo",
			Header: nats.Header{protocol.HeaderJobID: {bad}, protocol.HeaderMsgID: {fmt.Sprintf("fine-%d", i)}}})
		id := protocol.FallbackJobID(seq)
		ev := f.events.WaitFor(t, waitTimeout, id, protocol.EventDead)
		assert.Equal(t, protocol.ReasonInvalidHeaders, ev.GetReason(), "%q", bad)
		assert.Equal(t, protocol.CodeInvalidHeaders, ev.GetErrorCode(), "%q", bad)
		fleettest.WaitStreamMsgs(t, f.js, protocol.StreamDLQ, uint64(i+1), waitTimeout)
		dl, h := f.lastDeadLetter(t)
		assert.Equal(t, id, dl.GetJobId(), "%q", bad)
		assert.Equal(t, id, h.Get(protocol.HeaderJobID))
		assert.Equal(t, []string{bad}, dl.GetHeaders()[protocol.HeaderJobID].GetValues())
		assert.Contains(t, dl.GetLastError(), protocol.HeaderJobID)
	}
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, waitTimeout)
}

// lastDeadLetter returns the newest dead letter and its message headers.
func (f *fleet) lastDeadLetter(t *testing.T) (*jetfleetpb.DeadLetter, nats.Header) {
	t.Helper()
	ctx := fleettest.Ctx(t, waitTimeout)
	s, err := f.js.Stream(ctx, protocol.StreamDLQ)
	require.NoError(t, err)
	m, err := s.GetLastMsgForSubject(ctx, protocol.DLQSubjects)
	require.NoError(t, err)
	var dl jetfleetpb.DeadLetter
	require.NoError(t, protocol.Unmarshal(m.Data, &dl))
	return &dl, m.Header
}

// eventsBy returns the types of the events agentID published about jobID.
func (f *fleet) eventsBy(agentID, jobID string) []string {
	var out []string
	for _, ev := range f.events.All() {
		if ev.GetJobId() == jobID && ev.GetAgentId() == agentID {
			out = append(out, ev.GetType())
		}
	}
	return out
}

// TestAgentCreatesAMissingQueue: an agent creates the consumer of a queue
// that does not exist yet, with the default settings (§1.1).
func TestAgentCreatesAMissingQueue(t *testing.T) {
	f := newFleet(t, topology.QueueConfig{})
	f.startAgent(t, "c-fresh", "--queue", "fresh")
	fleettest.Publish(t, f.js, protocol.Job{ID: "fresh-1", Queue: "fresh", Kind: "echo"})
	f.events.WaitFor(t, waitTimeout, "fresh-1", protocol.EventSucceeded)
	info, err := f.js.Consumer(fleettest.Ctx(t, waitTimeout), protocol.StreamJobs, protocol.QueueConsumer("fresh"))
	require.NoError(t, err)
	cfg := info.CachedInfo().Config
	assert.Equal(t, "jobs.fresh.>", cfg.FilterSubject)
	assert.Equal(t, 30*time.Second, cfg.AckWait)
	assert.Equal(t, 20, cfg.MaxDeliver)
	assert.Equal(t, 10000, cfg.MaxAckPending)
	assert.Equal(t, jetstream.AckExplicitPolicy, cfg.AckPolicy)
}
