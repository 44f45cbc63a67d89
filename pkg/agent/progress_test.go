package agent_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// msgs collects core NATS messages on a subject, headers included.
type msgs struct {
	mu   sync.Mutex
	all  []*nats.Msg
	cond chan struct{}
}

func collect(t *testing.T, nc *nats.Conn, subject string) *msgs {
	t.Helper()
	c := &msgs{cond: make(chan struct{})}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		c.mu.Lock()
		c.all = append(c.all, m)
		close(c.cond)
		c.cond = make(chan struct{})
		c.mu.Unlock()
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return c
}

// wait returns the first message that matches, waiting up to timeout.
func (c *msgs) wait(t *testing.T, timeout time.Duration, what string, match func(*nats.Msg) bool) *nats.Msg {
	t.Helper()
	deadline := time.After(timeout)
	for {
		c.mu.Lock()
		for _, m := range c.all {
			if match(m) {
				c.mu.Unlock()
				return m
			}
		}
		cond := c.cond
		c.mu.Unlock()
		select {
		case <-cond:
		case <-deadline:
			t.Fatalf("no message %s within %s", what, timeout)
			return nil
		}
	}
}

func (c *msgs) list() []*nats.Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*nats.Msg(nil), c.all...)
}

// TestReportProgress: a handler's report becomes a progress event (after
// the attempt's started event), the job's latest event and its heartbeat
// entry; a tight loop of reports stores about one event a second, each with
// a message id of its own, the latest report each time; the outcome is the
// last event.
func TestReportProgress(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	const id = "resize-1"
	reported, loop, looped := make(chan struct{}), make(chan struct{}), make(chan time.Duration, 1)
	a := f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("resize", func(ctx context.Context, job *agent.Job) error {
			if err := agent.ReportProgress(ctx, 0.1, "resizing image 1 of 10"); err != nil {
				return err
			}
			close(reported)
			<-loop
			// A tight loop: every report must not become an event.
			start := time.Now()
			for i := 0; time.Since(start) < 2500*time.Millisecond; i++ {
				if err := agent.ReportProgress(ctx, 0.2+0.7*float64(i%1000)/1000, fmt.Sprintf("step %d", i)); err != nil {
					return err
				}
			}
			looped <- time.Since(start)
			return nil
		}, agent.KindOptions{}))
	})
	beats := collect(t, f.nc, protocol.HeartbeatSubject(a.ID()))
	progress := collect(t, f.nc, protocol.JobEventsOfType("default", "resize", protocol.EventProgress))
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: id, Queue: "default", Kind: "resize"})
	<-reported

	ev := f.events.WaitFor(t, 10*time.Second, id, protocol.EventProgress)
	assert.InDelta(t, 0.1, ev.GetProgress(), 1e-9)
	assert.Equal(t, "resizing image 1 of 10", ev.GetProgressMessage())
	assert.Equal(t, uint32(1), ev.GetAttempt())
	assert.Equal(t, seq, ev.GetStreamSequence())
	assert.Equal(t, uint64(1), ev.GetDelivered())
	assert.Equal(t, a.ID(), ev.GetAgentId())
	assert.Equal(t, []string{protocol.EventStarted, protocol.EventProgress}, f.events.Of(id),
		"the started event comes first, though the job ran for less than started_event_after")
	st := fleettest.WaitLatestEvent(t, f.js, id, protocol.EventProgress, 10*time.Second)
	assert.Equal(t, protocol.EventProgress, st.GetType(), "a running job's latest event is its progress")

	hb := beats.wait(t, 10*time.Second, "with the job's progress", func(m *nats.Msg) bool {
		var hb jetfleetpb.Heartbeat
		require.NoError(t, protocol.Unmarshal(m.Data, &hb))
		return len(hb.GetJobs()) == 1 && hb.GetJobs()[0].GetProgressAt() != nil
	})
	var doc jetfleetpb.Heartbeat
	require.NoError(t, protocol.Unmarshal(hb.Data, &doc))
	j := doc.GetJobs()[0]
	assert.Equal(t, id, j.GetJobId())
	assert.InDelta(t, 0.1, j.GetProgress(), 1e-9)
	assert.Equal(t, "resizing image 1 of 10", j.GetProgressMessage())
	assert.WithinDuration(t, ev.GetTime().AsTime(), j.GetProgressAt().AsTime(), time.Millisecond, "the report's time")

	close(loop)
	took := <-looped
	f.events.WaitFor(t, 10*time.Second, id, protocol.EventSucceeded)
	types := f.events.Of(id)
	assert.Equal(t, protocol.EventSucceeded, types[len(types)-1], "no progress after the outcome: %v", types)
	sent := progress.list()
	// The first report, then one a second at most while the loop ran.
	assert.GreaterOrEqual(t, len(sent), 3, "reports in the loop are sent, coalesced")
	assert.LessOrEqual(t, len(sent), 2+int(took/protocol.ProgressEventInterval), "at most one progress event a second")
	ids := map[string]bool{}
	var prev time.Time
	for i, m := range sent {
		msgID := m.Header.Get(protocol.HeaderMsgID)
		assert.Equal(t, protocol.ProgressEventMsgID(seq, 1, uint64(i+1)), msgID)
		ids[msgID] = true
		var ev jetfleetpb.JobEvent
		require.NoError(t, protocol.Unmarshal(m.Data, &ev))
		if i > 0 {
			assert.True(t, strings.HasPrefix(ev.GetProgressMessage(), "step "), ev.GetProgressMessage())
			// Events go out a second apart; the time is the report's, the
			// latest before the send.
			assert.GreaterOrEqual(t, ev.GetTime().AsTime().Sub(prev), protocol.ProgressEventInterval-50*time.Millisecond)
		}
		t.Logf("progress %s %s %v %q", msgID, ev.GetTime().AsTime().Format("15:04:05.000000"), ev.GetProgress(), ev.GetProgressMessage())
		prev = ev.GetTime().AsTime()
	}
	assert.Len(t, ids, len(sent))

	// Every one was stored: none was taken for a duplicate of another.
	ctx := fleettest.Ctx(t, 10*time.Second)
	events, err := f.js.Stream(ctx, protocol.StreamEvents)
	require.NoError(t, err)
	subject := protocol.JobEventSubject("default", "resize", protocol.EventProgress, id)
	info, err := events.Info(ctx, jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	assert.Equal(t, uint64(len(sent)), info.State.Subjects[subject])
}

// TestReportProgressRefusesBadFractions: NaN and numbers outside [0, 1] are
// refused, inside a handler and outside one; a good report still works
// after them.
func TestReportProgressRefusesBadFractions(t *testing.T) {
	t.Parallel()
	for _, bad := range []float64{math.NaN(), -0.01, 1.5, math.Inf(1)} {
		err := agent.ReportProgress(context.Background(), bad, "x")
		assert.ErrorIs(t, err, agent.ErrInvalidProgress, "%v outside a handler", bad)
	}
	assert.NoError(t, agent.ReportProgress(context.Background(), 0.5, "no job: a no-op"))

	f := setup(t, topology.Config{})
	errs := make(chan []error, 1)
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			var got []error
			for _, bad := range []float64{math.NaN(), -0.01, 1.5, math.Inf(-1)} {
				got = append(got, agent.ReportProgress(ctx, bad, "bad"))
			}
			got = append(got, agent.ReportProgress(ctx, 1, "done"))
			errs <- got
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "bad-fraction", Queue: "default", Kind: "work"})
	got := <-errs
	for i, err := range got[:4] {
		assert.ErrorIs(t, err, agent.ErrInvalidProgress, "report %d", i)
	}
	assert.NoError(t, got[4])
	ev := f.events.WaitFor(t, 10*time.Second, "bad-fraction", protocol.EventProgress)
	assert.Equal(t, 1.0, ev.GetProgress(), "only the good report is an event")
	f.events.WaitFor(t, 10*time.Second, "bad-fraction", protocol.EventSucceeded)
	assert.Equal(t, []string{protocol.EventStarted, protocol.EventProgress, protocol.EventSucceeded}, f.events.Of("bad-fraction"))
}

// TestReportProgressExtendsTheAckDeadline: a report sends +WPI at once
// (the agent's own would come only after AckWait/3, 10s here), and a job
// that runs longer than its queue's AckWait while reporting is not
// delivered again.
func TestReportProgressExtendsTheAckDeadline(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"slow": {AckWait: 2 * time.Second}}})
	acks := collect(t, f.nc, "$JS.ACK."+protocol.StreamJobs+".>")
	report := make(chan struct{})
	var mu sync.Mutex
	runs := map[string]int{}
	f.startAgent(t, agent.Config{Queues: []string{"default", "slow"}}, func(a *agent.Agent) {
		must(t, a.Register("long", func(ctx context.Context, job *agent.Job) error {
			mu.Lock()
			runs[job.ID]++
			mu.Unlock()
			if job.Queue == "default" {
				<-report
				return agent.ReportProgress(ctx, 0.5, "half way")
			}
			for i := range 25 { // 5s, past the 2s AckWait
				if err := agent.ReportProgress(ctx, float64(i)/25, "working"); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(200 * time.Millisecond): // the work the job does
				}
			}
			return nil
		}, agent.KindOptions{}))
	})

	// AckWait 30s: the agent's own +WPI would come after 10s.
	fleettest.Publish(t, f.js, protocol.Job{ID: "wpi-1", Queue: "default", Kind: "long"})
	f.events.WaitFor(t, 10*time.Second, "wpi-1", protocol.EventStarted)
	reportedAt := time.Now()
	close(report)
	acks.wait(t, 5*time.Second, "+WPI", func(m *nats.Msg) bool { return string(m.Data) == protocol.InProgressBody })
	assert.Less(t, time.Since(reportedAt), 5*time.Second)

	fleettest.Publish(t, f.js, protocol.Job{ID: "long-1", Queue: "slow", Kind: "long"})
	ev := f.events.WaitFor(t, 20*time.Second, "long-1", protocol.EventSucceeded)
	assert.Equal(t, uint64(1), ev.GetDelivered(), "never delivered again")
	assert.GreaterOrEqual(t, ev.GetDuration().AsDuration(), 5*time.Second)
	mu.Lock()
	assert.Equal(t, 1, runs["long-1"])
	mu.Unlock()
}
