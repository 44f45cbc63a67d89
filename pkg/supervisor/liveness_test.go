package supervisor_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/supervisor"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// runLog records which agent ran which job, and when jobs succeeded.
type runLog struct {
	mu        sync.Mutex
	runs      map[string][]string // job id → agents, in order
	succeeded map[string]int      // job id → index of the successful run
	late      []string            // runs that started after the job had succeeded
}

func newRunLog() *runLog {
	return &runLog{runs: map[string][]string{}, succeeded: map[string]int{}}
}

func (r *runLog) start(jobID, agentID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, done := r.succeeded[jobID]; done {
		r.late = append(r.late, jobID+" on "+agentID)
	}
	r.runs[jobID] = append(r.runs[jobID], agentID)
}

func (r *runLog) success(jobID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.succeeded[jobID] = len(r.runs[jobID]) - 1
}

// TestKillNineRescuesInFlightJobsWithinSeconds is the headline: an agent
// holding 20 jobs dies without a word (its connection cut, no Stop: no
// deregistration, no hand-back) while the queue's AckWait is 60s. The
// supervisor notices the missing heartbeats, finds the agent gone (its
// ping has no responder), records each job rescued and NAKs it, and the
// other agents finish all 20 within 5s of the kill. No job runs again
// after it succeeded.
func TestKillNineRescuesInFlightJobsWithinSeconds(t *testing.T) {
	t.Parallel()
	const jobs = 20
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	sup, _ := f.leader(t, supervisor.Config{}, nil) // defaults: 3 missed 1s heartbeats, 250ms checks
	runs := newRunLog()

	held := make(chan string, jobs)
	victim := f.startAgent(t, "", agent.Config{ID: "victim", Concurrency: jobs}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			runs.start(job.ID, "victim")
			held <- job.ID
			<-ctx.Done() // never finishes: the process is killed meanwhile
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	victimBeats := watchHeartbeats(t, f.nc, victim.ID())
	for i := range jobs {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("k-%02d", i), Queue: "default", Kind: "work"})
	}
	for range jobs {
		<-held
	}
	victimBeats.wait(t, 10*time.Second, time.Now(), func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == jobs })

	for _, id := range []string{"rescuer-1", "rescuer-2"} {
		f.startAgent(t, "", agent.Config{ID: id, Concurrency: jobs}, func(a *agent.Agent) {
			must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
				runs.start(job.ID, id)
				runs.success(job.ID)
				return nil
			}, agent.KindOptions{}))
		})
	}

	killedAt := time.Now()
	victim.kill()
	var last time.Time
	for i := range jobs {
		id := fmt.Sprintf("k-%02d", i)
		ev := f.events.WaitFor(t, 15*time.Second, id, protocol.EventSucceeded)
		assert.NotEqual(t, "victim", ev.GetAgentId())
		assert.Equal(t, uint32(2), ev.GetAttempt(), "the lost attempt counts")
		if at := ev.GetTime().AsTime(); at.After(last) {
			last = at
		}
	}
	took := last.Sub(killedAt)
	t.Logf("all %d jobs of the killed agent completed elsewhere %s after the kill (AckWait 60s)", jobs, took.Round(time.Millisecond))
	assert.Less(t, took, 5*time.Second)

	fleettest.WaitStreamMsgs(t, f.js, protocol.StreamJobs, 0, 10*time.Second) // nothing left that could run again
	runs.mu.Lock()
	assert.Empty(t, runs.late, "no job ran again after it succeeded")
	for i := range jobs {
		id := fmt.Sprintf("k-%02d", i)
		assert.Len(t, runs.runs[id], 2, "%s: the killed attempt and one rescue", id)
		assert.Equal(t, 1, countEvents(f.events, id, protocol.EventRescued), id)
	}
	runs.mu.Unlock()
	rescued := f.events.WaitFor(t, time.Second, "k-00", protocol.EventRescued)
	assert.Equal(t, "victim", rescued.GetAgentId())
	assert.Equal(t, protocol.CodeAgentLost, rescued.GetErrorCode())
	assert.Equal(t, uint64(1), rescued.GetDelivered())

	agents, err := f.client.Agents(fleettest.Ctx(t, 5*time.Second))
	require.NoError(t, err)
	states := map[string]string{}
	for _, a := range agents.Agents {
		states[a.ID] = a.State
	}
	assert.Equal(t, map[string]string{"victim": jetfleet.AgentDead, "rescuer-1": jetfleet.AgentAlive, "rescuer-2": jetfleet.AgentAlive}, states)

	// The rescues surface on /metrics. A rescue is counted just after its
	// NAK, which may be after the job it freed succeeded elsewhere.
	waitFor(t, 5*time.Second, "every rescue counted", func() bool {
		return metricValue(t, sup, "jetfleet_supervisor_rescues_total") == float64(jobs)
	})
	assert.Equal(t, float64(2), metricValue(t, sup, "jetfleet_supervisor_agents_alive"))
}

// metricValue sums the samples of a metric family of the supervisor's registry.
func metricValue(t *testing.T, s *supervisor.Supervisor, name string) float64 {
	t.Helper()
	families, err := s.Registry().Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range families {
		names = append(names, mf.GetName())
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			}
		}
		return sum
	}
	t.Fatalf("no metric %s among %s", name, strings.Join(names, ", "))
	return 0
}

// TestSlowAgentIsNotDeclaredDead freezes an agent's connection (as SIGSTOP
// would: nothing is lost, everything arrives late) for less than the dead
// threshold. Its heartbeats stop, then arrive again: it is not declared
// dead, nothing is rescued, and its jobs finish on it, first attempt.
func TestSlowAgentIsNotDeclaredDead(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	// Dead after 8 missed 250ms heartbeats: 2s.
	f.leader(t, fast(supervisor.Config{MissedHeartbeats: 8}), nil)
	p := natstest.NewProxy(t, strings.TrimPrefix(f.srv.ClientURL(), "nats://"))
	release := make(chan struct{})
	held := make(chan string, 3)
	slow := f.startAgent(t, p.URL(), agent.Config{ID: "slow", HeartbeatInterval: 250 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			held <- job.ID
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}, agent.KindOptions{}))
	})
	beats := watchHeartbeats(t, f.nc, slow.ID())
	for i := range 3 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("s-%d", i), Queue: "default", Kind: "work"})
	}
	for range 3 {
		<-held
	}
	beats.wait(t, 10*time.Second, time.Now(), func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == 3 })

	frozenAt := time.Now()
	p.Pause()
	time.Sleep(1200 * time.Millisecond) // the length of the freeze is the scenario, not a wait for something
	p.Unpause()
	after := beats.wait(t, 10*time.Second, time.Now(), func(*jetfleetpb.Heartbeat) bool { return true })
	gap := beats.maxGap(frozenAt.Add(-time.Second), after.at)
	t.Logf("longest silence of the frozen agent: %s (dead threshold 2s)", gap.Round(time.Millisecond))
	assert.GreaterOrEqual(t, gap, time.Second, "the freeze silenced the heartbeats")

	// The supervisor has seen the heartbeat after the freeze: it checks
	// every 50ms, so a wrong verdict would have been taken by now.
	agents, err := f.client.Agents(fleettest.Ctx(t, 5*time.Second))
	require.NoError(t, err)
	require.Len(t, agents.Agents, 1)
	assert.Equal(t, jetfleet.AgentAlive, agents.Agents[0].State)

	close(release)
	for i := range 3 {
		ev := f.events.WaitFor(t, 10*time.Second, fmt.Sprintf("s-%d", i), protocol.EventSucceeded)
		assert.Equal(t, "slow", ev.GetAgentId())
		assert.Equal(t, uint64(1), ev.GetDelivered(), "never redelivered")
	}
	for _, ev := range f.events.All() {
		assert.NotEqual(t, protocol.EventRescued, ev.GetType(), "%s was rescued", ev.GetJobId())
	}
}

// TestFrozenAgentPastThresholdIsRescued is the other side: frozen longer
// than the threshold, the agent does not answer the ping either (a live
// but stuck process), is declared dead, and its jobs run elsewhere.
func TestFrozenAgentPastThresholdIsRescued(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	f.leader(t, fast(supervisor.Config{MissedHeartbeats: 4}), nil) // 4 × 250ms = 1s
	p := natstest.NewProxy(t, strings.TrimPrefix(f.srv.ClientURL(), "nats://"))
	held := make(chan string, 2)
	frozen := f.startAgent(t, p.URL(), agent.Config{ID: "frozen", HeartbeatInterval: 250 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			held <- job.ID
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	beats := watchHeartbeats(t, f.nc, frozen.ID())
	for i := range 2 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("f-%d", i), Queue: "default", Kind: "work"})
	}
	<-held
	<-held
	beats.wait(t, 10*time.Second, time.Now(), func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == 2 })
	f.startAgent(t, "", agent.Config{ID: "healthy"}, func(a *agent.Agent) {
		must(t, a.Register("work", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})
	p.Pause()
	defer p.Unpause()
	for i := range 2 {
		ev := f.events.WaitFor(t, 15*time.Second, fmt.Sprintf("f-%d", i), protocol.EventSucceeded)
		assert.Equal(t, "healthy", ev.GetAgentId())
		rescued := f.events.WaitFor(t, time.Second, fmt.Sprintf("f-%d", i), protocol.EventRescued)
		assert.Equal(t, "frozen", rescued.GetAgentId())
	}
}

// TestGracefulStopIsNotRescued: an agent that stops cleanly hands its jobs
// back itself (released) and deregisters; the supervisor must not act on
// the silence that follows.
func TestGracefulStopIsNotRescued(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	f.leader(t, fast(supervisor.Config{MissedHeartbeats: 3}), nil)
	held := make(chan string, 2)
	leaving := f.startAgent(t, "", agent.Config{ID: "leaving", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			held <- job.ID
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	for i := range 2 {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("g-%d", i), Queue: "default", Kind: "work"})
	}
	<-held
	<-held
	var ran sync.Map
	f.startAgent(t, "", agent.Config{ID: "staying", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", func(_ context.Context, job *agent.Job) error {
			ran.Store(job.ID, true)
			return nil
		}, agent.KindOptions{}))
	})
	alerts := subscribe(t, f.nc, "jetfleet.alerts.>")
	// The jobs outlive the grace: handed back. The grace leaves Stop a
	// second to hand back, flush and deregister, however loaded the machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = leaving.Stop(ctx)
	for i := range 2 {
		id := fmt.Sprintf("g-%d", i)
		f.events.WaitFor(t, 10*time.Second, id, protocol.EventReleased)
		f.events.WaitFor(t, 10*time.Second, id, protocol.EventSucceeded)
	}
	f.logs.Wait(t, 10*time.Second, "of the deregistration", fleettest.MatchLog("agent deregistered", "agent_id", "leaving"))
	// Let the supervisor see the silence well past the threshold (300ms).
	time.Sleep(time.Second) // the silence must last; nothing announces that nothing happens
	for i := range 2 {
		assert.Zero(t, countEvents(f.events, fmt.Sprintf("g-%d", i), protocol.EventRescued))
	}
	agents, err := f.client.Agents(fleettest.Ctx(t, 5*time.Second))
	require.NoError(t, err)
	for _, a := range agents.Agents {
		assert.NotEqual(t, "leaving", a.ID, "a deregistered agent is not listed")
	}
	assert.Zero(t, f.logs.Count(fleettest.MatchLog("agent declared dead", "agent_id", "leaving")), "never in state dead")
	for len(alerts.ch) > 0 {
		var al jetfleetpb.Alert
		require.NoError(t, protocol.Unmarshal((<-alerts.ch).Data, &al))
		assert.NotEqual(t, "agent_dead", al.GetType(), "%s", al.GetSummary())
	}
}

// TestStalledSupervisorDoesNotRescueLiveAgents stalls the supervisor's own
// connection (as a long GC pause or a frozen network path would) past the
// dead threshold while the agents stay healthy. Every agent looks silent
// and no ping gets an answer, but no responder is not what the supervisor
// sees: it judges nobody until its connection answers and it has read the
// heartbeats the server kept for it. Nothing is rescued; the held job runs
// once.
func TestStalledSupervisorDoesNotRescueLiveAgents(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{LeaseTTL: 10 * time.Second, Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	p := natstest.NewProxy(t, strings.TrimPrefix(f.srv.ClientURL(), "nats://"))
	// Dead after 4 missed 250ms heartbeats: 1s. The lease (held 8s
	// without renewal) outlives the stall.
	sup, _ := f.startSupervisorURL(t, p.URL(), fast(supervisor.Config{MissedHeartbeats: 4}), nil)
	require.NoError(t, sup.WaitLeading(fleettest.Ctx(t, 20*time.Second), true))
	var mu sync.Mutex
	var runs []string
	release := make(chan struct{})
	held := make(chan struct{}, 4)
	reg := func(id string) func(a *agent.Agent) {
		return func(a *agent.Agent) {
			must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
				mu.Lock()
				runs = append(runs, id)
				mu.Unlock()
				held <- struct{}{}
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}, agent.KindOptions{}))
		}
	}
	f.startAgent(t, "", agent.Config{ID: "healthy-a", HeartbeatInterval: 250 * time.Millisecond}, reg("healthy-a"))
	beats := watchHeartbeats(t, f.nc, "healthy-a")
	fleettest.Publish(t, f.js, protocol.Job{ID: "live-1", Queue: "default", Kind: "work"})
	<-held
	beats.wait(t, 10*time.Second, time.Now(), func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == 1 })
	waitFor(t, 10*time.Second, "the supervisor to list the job", func() bool {
		jobs, err := f.client.RunningJobs(fleettest.Ctx(t, 5*time.Second), jetfleet.RunningJobsRequest{AgentID: "healthy-a"})
		return err == nil && len(jobs.Jobs) == 1
	})
	// A second agent would run the job again, were it released.
	f.startAgent(t, "", agent.Config{ID: "healthy-b", HeartbeatInterval: 250 * time.Millisecond}, reg("healthy-b"))

	p.Pause()
	f.logs.Wait(t, 10*time.Second, "that the stall was noticed", fleettest.MatchLog("silent agents not judged: the supervisor's own connection does not answer in time"))
	time.Sleep(500 * time.Millisecond) // the stall goes on a while: the scenario, not a wait
	p.Unpause()
	f.logs.Wait(t, 10*time.Second, "that the connection recovered", fleettest.MatchLog("the supervisor's connection answers again; silent agents are judged"))
	states, err := f.client.Agents(fleettest.Ctx(t, 5*time.Second)) // answered through the stalled connection
	require.NoError(t, err)
	for _, a := range states.Agents {
		assert.Equal(t, jetfleet.AgentAlive, a.State, a.ID)
	}

	close(release)
	ok := f.events.WaitFor(t, 10*time.Second, "live-1", protocol.EventSucceeded)
	assert.Equal(t, "healthy-a", ok.GetAgentId())
	assert.Equal(t, uint64(1), ok.GetDelivered(), "never redelivered")
	assert.Zero(t, countEvents(f.events, "live-1", protocol.EventRescued), "a live agent's job was rescued")
	assert.Zero(t, f.logs.Count(fleettest.MatchLog("agent declared dead")), "no agent declared dead")
	mu.Lock()
	assert.Equal(t, []string{"healthy-a"}, runs, "the job ran once")
	mu.Unlock()
	assert.True(t, sup.IsLeader(), "the stall was shorter than the lease")
}

// TestRestartWithSameIDRescuesAtOnce: an agent process dies holding a job
// and comes back at once with the same agent id (a service manager's
// restart). The new process cannot hold the old one's jobs: they are
// rescued as soon as the old process has been silent for one interval,
// without waiting for the dead threshold or for AckWait.
func TestRestartWithSameIDRescuesAtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	// Dead threshold 20 × 250ms = 5s: a rescue before it is the restart's.
	f.leader(t, fast(supervisor.Config{MissedHeartbeats: 20}), nil)
	held := make(chan struct{}, 1)
	first := f.startAgent(t, "", agent.Config{ID: "host-1", HeartbeatInterval: 250 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			held <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	beats := watchHeartbeats(t, f.nc, "host-1")
	fleettest.Publish(t, f.js, protocol.Job{ID: "r-1", Queue: "default", Kind: "work"})
	<-held
	beats.wait(t, 10*time.Second, time.Now(), func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == 1 })
	waitFor(t, 10*time.Second, "the supervisor to list the job", func() bool {
		jobs, err := f.client.RunningJobs(fleettest.Ctx(t, 5*time.Second), jetfleet.RunningJobsRequest{AgentID: "host-1"})
		return err == nil && len(jobs.Jobs) == 1
	})
	killedAt := time.Now()
	first.kill()
	f.startAgent(t, "", agent.Config{ID: "host-1", HeartbeatInterval: 250 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})
	rescued := f.events.WaitFor(t, 10*time.Second, "r-1", protocol.EventRescued)
	ok := f.events.WaitFor(t, 10*time.Second, "r-1", protocol.EventSucceeded)
	took := time.Since(killedAt)
	t.Logf("the restarted agent ran the job %s after the crash (dead threshold 5s, AckWait 60s)", took.Round(time.Millisecond))
	assert.Less(t, took, 5*time.Second, "before the dead threshold")
	assert.Equal(t, "host-1", rescued.GetAgentId())
	assert.Equal(t, uint64(1), rescued.GetDelivered())
	assert.Equal(t, uint64(2), ok.GetDelivered())
	assert.Equal(t, 1, countEvents(f.events, "r-1", protocol.EventRescued))
	assert.Zero(t, f.logs.Count(fleettest.MatchLog("agent declared dead", "agent_id", "host-1")), "the agent id stayed alive")
}

// TestFollowerVerdictIsProbedBeforeRescue: a follower marks a silent agent
// dead without probing it (it does not act). When it becomes leader it
// probes that agent first: one that answers is alive, and nothing of it is
// rescued. The agent is played by the test: heartbeats that stop, and a
// control subject that answers.
func TestFollowerVerdictIsProbedBeforeRescue(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	ctx := fleettest.Ctx(t, 60*time.Second)
	leases, err := f.js.KeyValue(ctx, protocol.BucketLeases)
	require.NoError(t, err)
	// The test holds the lease until it lets the replica lead.
	rev, err := leases.Create(ctx, supervisor.DefaultLeaseKey, []byte(`{"holder":"test"}`))
	require.NoError(t, err)
	holding := make(chan struct{})
	held := make(chan struct{})
	go func() {
		defer close(held)
		tick := time.NewTicker(time.Second) // well inside the bucket's TTL (5s)
		defer tick.Stop()
		for {
			select {
			case <-holding:
				_ = leases.Delete(context.Background(), supervisor.DefaultLeaseKey, jetstream.LastRevision(rev))
				return
			case <-tick.C:
				if r, err := leases.Update(ctx, supervisor.DefaultLeaseKey, []byte(`{"holder":"test"}`), rev); err == nil {
					rev = r
				}
			}
		}
	}()
	release := func() {
		close(holding)
		<-held
	}
	defer func() {
		select {
		case <-holding:
		default:
			release()
		}
	}()
	sup, _ := f.startSupervisor(t, fast(supervisor.Config{MissedHeartbeats: 3}), nil)
	require.False(t, sup.IsLeader())

	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "ghost-job", Queue: "default", Kind: "haunt"})
	answered := subscribeReply(t, f.nc, protocol.ControlSubject("ghost"))
	started := time.Now()
	hb := func(n uint64) {
		data, err := protocol.Marshal(&jetfleetpb.Heartbeat{AgentId: "ghost", Pid: 7, StartedAt: timestamppb.New(started),
			SentAt: timestamppb.Now(), Interval: durationpb.New(100 * time.Millisecond), Queues: []string{"default"}, Capacity: 1,
			Sequence: n, Jobs: []*jetfleetpb.InFlightJob{{JobId: "ghost-job", Queue: "default", Kind: "haunt",
				ReplySubject:   fmt.Sprintf("$JS.ACK.%s.%s.1.%d.1.%d.0", protocol.StreamJobs, protocol.QueueConsumer("default"), seq, time.Now().UnixNano()),
				StreamSequence: seq, Delivered: 1, StartedAt: timestamppb.New(started)}}})
		require.NoError(t, err)
		require.NoError(t, f.nc.Publish(protocol.HeartbeatSubject("ghost"), data))
	}
	hb(1)
	hb(2)
	require.NoError(t, f.nc.Flush())
	// Silent for 3 × 100ms: the follower marks it dead, without a probe.
	f.logs.Wait(t, 10*time.Second, "of the follower's verdict", fleettest.MatchLog("agent declared dead", "agent_id", "ghost", "probed", "false"))
	assert.Zero(t, answered.Load(), "followers do not probe")

	release()
	require.NoError(t, sup.WaitLeading(ctx, true))
	f.logs.Wait(t, 10*time.Second, "of the leader's probe", fleettest.MatchLog("agent missed heartbeats but answers; not declared dead", "agent_id", "ghost"))
	assert.Positive(t, answered.Load())
	assert.Equal(t, jetfleet.AgentAlive, sup.AgentStates()["ghost"])
	assert.Zero(t, countEvents(f.events, "ghost-job", protocol.EventRescued), "a live agent's job was rescued")
}

// subscribeReply answers every request on subject with an empty Error
// document (success), as an agent's control subject does, and counts them.
func subscribeReply(t *testing.T, nc *nats.Conn, subject string) *atomic.Int32 {
	t.Helper()
	var n atomic.Int32
	ok, err := protocol.Marshal(&jetfleetpb.Error{})
	require.NoError(t, err)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		n.Add(1)
		_ = m.Respond(ok)
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return &n
}

// TestAckOverdueIsReported: an agent whose progress reports stop reaching
// the server (frozen for longer than AckWait, shorter than the dead
// threshold) loses its job to another agent; once it speaks again it still
// lists the job, which the supervisor reports as ack-overdue.
func TestAckOverdueIsReported(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: time.Second}}})
	alerts := subscribe(t, f.nc, protocol.AlertSubject(protocol.SeverityWarning))
	f.leader(t, fast(supervisor.Config{MissedHeartbeats: 20}), nil) // 20 × 250ms = 5s
	p := natstest.NewProxy(t, strings.TrimPrefix(f.srv.ClientURL(), "nats://"))
	release := make(chan struct{})
	defer close(release)
	hold := func(ctx context.Context, job *agent.Job) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	held := make(chan struct{}, 1)
	late := f.startAgent(t, p.URL(), agent.Config{ID: "late", HeartbeatInterval: 250 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", func(ctx context.Context, job *agent.Job) error {
			held <- struct{}{}
			return hold(ctx, job)
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "ao-1", Queue: "default", Kind: "work"})
	<-held
	beats := watchHeartbeats(t, f.nc, late.ID())
	beats.wait(t, 10*time.Second, time.Now(), func(hb *jetfleetpb.Heartbeat) bool { return len(hb.GetJobs()) == 1 })
	f.startAgent(t, "", agent.Config{ID: "taker", HeartbeatInterval: 250 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("work", hold, agent.KindOptions{}))
	})
	p.Pause()
	takerBeats := watchHeartbeats(t, f.nc, "taker")
	// JetStream redelivers after AckWait: to taker, or first to late's pull
	// request still open at the server (the frozen proxy holds it), then to taker.
	takerBeats.wait(t, 10*time.Second, time.Time{}, func(hb *jetfleetpb.Heartbeat) bool {
		return len(hb.GetJobs()) == 1 && hb.GetJobs()[0].GetDelivered() >= 2
	})
	p.Unpause()

	m := alerts.next(t, 10*time.Second)
	var al jetfleetpb.Alert
	require.NoError(t, protocol.Unmarshal(m.Data, &al))
	assert.Equal(t, "ack_overdue", al.GetType())
	assert.Equal(t, "late", al.GetAgentId())
	assert.Equal(t, "ao-1", al.GetJobId())
	status, err := f.client.Status(fleettest.Ctx(t, 5*time.Second))
	require.NoError(t, err)
	// One entry per delivery late holds: the first, and the second too when
	// it went to late's open pull request.
	require.NotEmpty(t, status.Attention)
	for _, j := range status.Attention {
		assert.Equal(t, "ack_overdue", j.State)
		assert.Equal(t, "late", j.AgentID)
		assert.Equal(t, "ao-1", j.JobID)
	}
	assert.Equal(t, 2, status.AgentsAlive, "late is slow, not dead")
}

// TestRescueCarriesSnoozes: the rescued event becomes the job's latest
// event, and agents count attempts from its snoozes, so it carries them
// forward — a snoozed job killed on its second delivery runs its third
// delivery as attempt 2.
func TestRescueCarriesSnoozes(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	f.leader(t, fast(supervisor.Config{MissedHeartbeats: 3}), nil)
	held := make(chan struct{}, 1)
	victim := f.startAgent(t, "", agent.Config{ID: "snoozer", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("nap", func(ctx context.Context, job *agent.Job) error {
			if job.Delivered == 1 {
				return agent.Snooze(10 * time.Millisecond)
			}
			held <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}, agent.KindOptions{}))
	})
	beats := watchHeartbeats(t, f.nc, victim.ID())
	fleettest.Publish(t, f.js, protocol.Job{ID: "nap-1", Queue: "default", Kind: "nap"})
	<-held
	beats.wait(t, 10*time.Second, time.Time{}, func(hb *jetfleetpb.Heartbeat) bool {
		return len(hb.GetJobs()) == 1 && hb.GetJobs()[0].GetDelivered() == 2
	})
	attempts := make(chan int, 1)
	f.startAgent(t, "", agent.Config{ID: "rescuer", HeartbeatInterval: 100 * time.Millisecond}, func(a *agent.Agent) {
		must(t, a.Register("nap", func(_ context.Context, job *agent.Job) error {
			attempts <- job.Attempt
			return nil
		}, agent.KindOptions{}))
	})
	victim.kill()
	rescued := f.events.WaitFor(t, 10*time.Second, "nap-1", protocol.EventRescued)
	assert.Equal(t, uint32(1), rescued.GetSnoozes())
	assert.Equal(t, uint64(2), rescued.GetDelivered())
	ok := f.events.WaitFor(t, 10*time.Second, "nap-1", protocol.EventSucceeded)
	assert.Equal(t, uint64(3), ok.GetDelivered())
	assert.Equal(t, 2, <-attempts, "delivered 3 − 1 snooze")
	assert.Equal(t, uint32(1), ok.GetSnoozes())
}

// TestAckOverdueNeedsAFreshHeartbeat: an agent answers a job with a retry
// after a short backoff, and another agent reports the next delivery
// before the first agent's next heartbeat, which still lists the first
// delivery. Heartbeats of different ages say nothing about an overdue ack:
// no ack_overdue until a heartbeat of the first agent sent one of its
// intervals after the redelivery still lists the old delivery.
func TestAckOverdueNeedsAFreshHeartbeat(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 60 * time.Second}}})
	alerts := subscribe(t, f.nc, protocol.AlertSubject(protocol.SeverityWarning))
	f.leader(t, fast(supervisor.Config{MissedHeartbeats: 50}), nil)
	ctx := fleettest.Ctx(t, 30*time.Second)
	seq := fleettest.Publish(t, f.js, protocol.Job{ID: "retried", Queue: "default", Kind: "work"})
	subscribeReply(t, f.nc, protocol.ControlSubject("first"))
	subscribeReply(t, f.nc, protocol.ControlSubject("second"))
	started := time.Now()
	beats := map[string]uint64{}
	hb := func(agentID string, delivered uint64) {
		beats[agentID]++
		data, err := protocol.Marshal(&jetfleetpb.Heartbeat{AgentId: agentID, Pid: 7, StartedAt: timestamppb.New(started),
			SentAt: timestamppb.Now(), Interval: durationpb.New(200 * time.Millisecond), Queues: []string{"default"}, Capacity: 1,
			Sequence: beats[agentID], Jobs: []*jetfleetpb.InFlightJob{{JobId: "retried", Queue: "default", Kind: "work",
				ReplySubject: fmt.Sprintf("$JS.ACK.%s.%s.%d.%d.1.%d.0", protocol.StreamJobs, protocol.QueueConsumer("default"),
					delivered, seq, time.Now().UnixNano()),
				StreamSequence: seq, Delivered: delivered, StartedAt: timestamppb.Now()}}})
		require.NoError(t, err)
		require.NoError(t, f.nc.Publish(protocol.HeartbeatSubject(agentID), data))
		require.NoError(t, f.nc.Flush())
	}
	states := func(agentID string) map[uint64]string {
		res, err := f.client.RunningJobs(ctx, jetfleet.RunningJobsRequest{AgentID: agentID})
		require.NoError(t, err)
		out := map[uint64]string{}
		for _, j := range res.Jobs {
			out[j.Delivered] = j.State
		}
		return out
	}

	hb("first", 1)  // sent before its retry NAK…
	hb("second", 2) // …and the redelivery reported at once
	waitFor(t, 10*time.Second, "the second delivery to be seen", func() bool { return states("second")[2] == "running" })
	assert.Equal(t, map[uint64]string{1: "running"}, states("first"), "a heartbeat sent before the redelivery is no overdue ack")
	status, err := f.client.Status(ctx)
	require.NoError(t, err)
	assert.Empty(t, status.Attention)

	// The first agent really keeps the old delivery: its heartbeats, one
	// interval after the redelivery, still list it.
	waitFor(t, 10*time.Second, "ack_overdue of the first agent", func() bool {
		hb("first", 1)
		hb("second", 2)
		return states("first")[1] == "ack_overdue"
	})
	var al jetfleetpb.Alert
	require.NoError(t, protocol.Unmarshal(alerts.next(t, 10*time.Second).Data, &al))
	assert.Equal(t, "ack_overdue", al.GetType())
	assert.Equal(t, "first", al.GetAgentId())
}
