package supervisor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

type later struct {
	N int `json:"n"`
}

func (later) Kind() string { return "later" }

// startTimes records when each job's handler started.
type startTimes struct {
	mu sync.Mutex
	at map[string][]time.Time
}

func (s *startTimes) handler(_ context.Context, job *agent.Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at[job.ID] = append(s.at[job.ID], time.Now())
	return nil
}

func (s *startTimes) of(id string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at[id]...)
}

// TestDelayedJobRunsWhenDue: a job enqueued with a process_at waits in
// DELAYED — visible as delayed in Job, JobDetail and the status count —
// and runs once, not before it is due. A process_at that has passed runs
// now, and the result says so.
func TestDelayedJobRunsWhenDue(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	starts := &startTimes{at: map[string][]time.Time{}}
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) { must(t, a.Register("later", starts.handler, agent.KindOptions{})) })

	due := time.Now().Add(2 * time.Second)
	res, err := f.client.Enqueue(ctx, later{N: 1}, jetfleet.WithJobID("due-soon"), jetfleet.WithProcessAt(due))
	require.NoError(t, err)
	assert.True(t, due.Equal(res.ProcessAt), "the result says it is delayed until %s, got %s", due, res.ProcessAt)
	assert.False(t, res.ProcessAtPassed)
	dup, err := f.client.Enqueue(ctx, later{N: 1}, jetfleet.WithJobID("due-soon"), jetfleet.WithProcessAt(due))
	require.NoError(t, err)
	assert.True(t, dup.Duplicate, "the same delayed job enqueued twice is stored once")

	info, err := f.client.Job(ctx, "due-soon")
	require.NoError(t, err)
	assert.Equal(t, jetfleet.StateDelayed, info.State)
	assert.True(t, due.Equal(info.ProcessAt))
	detail, err := f.client.JobDetail(ctx, jetfleet.JobDetailRequest{JobID: "due-soon"})
	require.NoError(t, err)
	require.NotNil(t, detail.Delayed)
	assert.Equal(t, "default", detail.Delayed.Queue)
	status, err := f.client.Status(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), status.Delayed)

	past, err := f.client.Enqueue(ctx, later{N: 2}, jetfleet.WithJobID("due-already"), jetfleet.WithProcessAt(time.Now().Add(-time.Hour)))
	require.NoError(t, err)
	assert.True(t, past.ProcessAtPassed, "a process_at in the past runs now, and the result says so")
	assert.True(t, past.ProcessAt.IsZero())
	f.events.WaitFor(t, 10*time.Second, "due-already", protocol.EventSucceeded)

	f.events.WaitFor(t, 10*time.Second, "due-soon", protocol.EventSucceeded)
	runs := starts.of("due-soon")
	require.Len(t, runs, 1)
	assert.False(t, runs[0].Before(due), "ran at %s, before it was due at %s", runs[0], due)
	status, err = f.client.Status(ctx)
	require.NoError(t, err)
	assert.Zero(t, status.Delayed)
	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second)
}

// TestDelayedByHeader: a producer that only speaks NATS publishes the job
// to jobs.<queue>.<kind> with Jetfleet-Process-At; the agent that gets it
// early moves it to DELAYED, and it runs once when due. An unreadable
// Jetfleet-Process-At is dead-lettered as invalid_headers, not guessed.
func TestDelayedByHeader(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	starts := &startTimes{at: map[string][]time.Time{}}
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) { must(t, a.Register("later", starts.handler, agent.KindOptions{})) })

	due := time.Now().Add(2 * time.Second).UTC()
	publish := func(id, processAt string) {
		_, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: "jobs.default.later", Data: []byte(`{}`),
			Header: nats.Header{protocol.HeaderJobID: {id}, protocol.HeaderProcessAt: {processAt}}})
		require.NoError(t, err)
	}
	publish("by-header", due.Format(time.RFC3339Nano))
	publish("bad-time", "tomorrow at noon")

	dead := f.events.WaitFor(t, 10*time.Second, "bad-time", protocol.EventDead)
	assert.Equal(t, protocol.ReasonInvalidHeaders, dead.GetReason())
	assert.Contains(t, dead.GetError(), protocol.HeaderProcessAt)

	f.events.WaitFor(t, 10*time.Second, "by-header", protocol.EventSucceeded)
	runs := starts.of("by-header")
	require.Len(t, runs, 1)
	assert.False(t, runs[0].Before(due), "ran at %s, before it was due at %s", runs[0], due)
	assert.Empty(t, starts.of("bad-time"))
}

// TestCancelDelayedJob: a cancelled delayed job never runs and ends
// cancelled; one due later than it runs (so the first would have fired by
// then).
func TestCancelDelayedJob(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	f.leader(t, fast(supervisor.Config{}), nil)
	ctx := fleettest.Ctx(t, 60*time.Second)
	starts := &startTimes{at: map[string][]time.Time{}}
	f.startAgent(t, "", agent.Config{}, func(a *agent.Agent) { must(t, a.Register("later", starts.handler, agent.KindOptions{})) })

	_, err := f.client.Enqueue(ctx, later{}, jetfleet.WithJobID("never"), jetfleet.WithProcessIn(time.Second))
	require.NoError(t, err)
	_, err = f.client.Enqueue(ctx, later{}, jetfleet.WithJobID("witness"), jetfleet.WithProcessIn(2*time.Second))
	require.NoError(t, err)
	res, err := f.client.Cancel(ctx, "never", jetfleet.CancelReason("plans changed"))
	require.NoError(t, err)
	assert.Equal(t, jetfleet.CancelDelayed, res.Where)
	ev := fleettest.LatestEvent(t, f.js, "never")
	assert.Equal(t, protocol.EventCancelled, ev.GetType())
	assert.Contains(t, ev.GetError(), "plans changed")

	f.events.WaitFor(t, 10*time.Second, "witness", protocol.EventSucceeded)
	assert.Empty(t, starts.of("never"), "the cancelled delayed job ran")
	assert.Empty(t, fleettest.DeadLetters(t, f.js))
}

// TestDelayedJobSurvivesAServerRestart: a delayed job stored before the
// NATS server restarts fires once, after the restart, when due.
func TestDelayedJobSurvivesAServerRestart(t *testing.T) {
	t.Parallel()
	srv := natstest.RestartableServer(t, embedded.Options{})
	topo := topology.Config{}
	env := fleettest.NewEnvURL(t, srv.URL(), topo) // provisions the topology
	client := jetfleet.NewClient(env.Env.Conn)
	ctx := fleettest.Ctx(t, 60*time.Second)
	due := time.Now().Add(3 * time.Second)
	_, err := client.Enqueue(ctx, later{}, jetfleet.WithJobID("across-restart"), jetfleet.WithProcessAt(due))
	require.NoError(t, err)

	srv.Stop()
	srv.Start(t)
	starts := &startTimes{at: map[string][]time.Time{}}
	agentEnv := fleettest.NewEnvURL(t, srv.URL(), topo)
	a, err := agent.New(agentEnv.Env.Conn, agent.Config{}, agent.WithEnv(agentEnv.Env))
	require.NoError(t, err)
	must(t, a.Register("later", starts.handler, agent.KindOptions{}))
	require.NoError(t, a.Start(ctx))
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = a.Stop(c)
	})
	nc, js := natstest.JetStream(t, srv.Server())
	_ = nc
	fleettest.WaitLatestEvent(t, js, "across-restart", protocol.EventSucceeded, 20*time.Second)
	fleettest.WaitStreamMsgs(t, js, protocol.StreamJobs, 0, 10*time.Second)
	runs := starts.of("across-restart")
	require.Len(t, runs, 1, "fired once")
	assert.False(t, runs[0].Before(due))
}
