package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// limitProbe is a handler that records when each job starts and how many
// of its jobs run at once, across every agent of the test.
type limitProbe struct {
	hold    time.Duration
	running atomic.Int32
	peak    atomic.Int32
	mu      sync.Mutex
	starts  []time.Time
}

func (p *limitProbe) handler(ctx context.Context, job *agent.Job) error {
	n := p.running.Add(1)
	defer p.running.Add(-1)
	for {
		peak := p.peak.Load()
		if n <= peak || p.peak.CompareAndSwap(peak, n) {
			break
		}
	}
	p.mu.Lock()
	p.starts = append(p.starts, time.Now())
	p.mu.Unlock()
	select {
	case <-time.After(p.hold):
	case <-ctx.Done():
	}
	return nil
}

func (p *limitProbe) startTimes() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.starts...)
}

func setLimit(t *testing.T, js jetstream.JetStream, queue, kind string, limit protocol.KindLimit) {
	t.Helper()
	require.NoError(t, limit.Validate())
	kv, err := js.KeyValue(fleettest.Ctx(t, 5*time.Second), protocol.BucketLimits)
	require.NoError(t, err)
	data, err := json.Marshal(limit)
	require.NoError(t, err)
	_, err = kv.Put(fleettest.Ctx(t, 5*time.Second), protocol.LimitDefKey(queue, kind), data)
	require.NoError(t, err)
}

// startKillableAgent starts an agent on a connection of its own that the
// test may close under it, as a crash does.
func (f *fixture) startKillableAgent(t *testing.T, cfg agent.Config, register func(a *agent.Agent)) (kill func()) {
	t.Helper()
	env := fleettest.NewEnv(t, f.srv, f.env.Base.Topology)
	a, err := agent.New(env.Env.Conn, cfg, agent.WithEnv(env.Env))
	require.NoError(t, err)
	register(a)
	require.NoError(t, a.Start(fleettest.Ctx(t, 10*time.Second)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Stop(ctx) // its connection is gone: it cannot answer for its jobs
	})
	return env.Env.Conn.Close
}

// TestFleetWideRateAndConcurrencyHoldAcrossThreeAgentsAndAKill is issue
// 20's accuracy target: three agents drain a backlog of a kind limited to
// 20 starts per second and 6 running at once for 60 s, and one of them is
// killed on the way. Starts stay within +2% of the rate, concurrency never
// exceeds its limit, waiting spends no attempt, and the wait is visible as
// waiting events.
func TestFleetWideRateAndConcurrencyHoldAcrossThreeAgentsAndAKill(t *testing.T) {
	t.Parallel()
	const (
		rate        = 20
		concurrency = 6
		window      = 60 * time.Second
	)
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 5 * time.Second}}})
	setLimit(t, f.js, "default", "call", protocol.KindLimit{Concurrency: concurrency, Rate: rate, Period: "1s"})
	probe := &limitProbe{hold: 100 * time.Millisecond}
	register := func(a *agent.Agent) { must(t, a.Register("call", probe.handler, agent.KindOptions{})) }
	cfg := func(id string) agent.Config { return agent.Config{ID: id, Concurrency: 10} }
	// A backlog that lasts past the window.
	jobs := int(window/time.Second)*rate + 300
	for i := range jobs {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("call-%04d", i), Queue: "default", Kind: "call"})
	}
	f.startAgent(t, cfg("limit-a"), register)
	f.startAgent(t, cfg("limit-b"), register)
	kill := f.startKillableAgent(t, cfg("limit-c"), register)

	// The window opens at the first start; the kill comes 20 s in.
	first := f.events.Wait(t, 30*time.Second, func(ev *jetfleetpb.JobEvent) bool {
		return ev.GetType() == protocol.EventStarted || ev.GetType() == protocol.EventSucceeded
	})
	require.NotNil(t, first)
	time.Sleep(20 * time.Second) // the test's own clock: a point in the run, not a synchronisation
	kill()
	deadline := time.Now().Add(window - 20*time.Second + 2*time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(time.Until(deadline))
	}

	starts := probe.startTimes()
	require.NotEmpty(t, starts)
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	open := starts[0]
	inWindow, peakPerSecond := 0, 0
	for i, s := range starts {
		if s.Sub(open) < window {
			inWindow++
		}
		n := 0
		for _, o := range starts[i:] {
			if o.Sub(s) >= time.Second {
				break
			}
			n++
		}
		peakPerSecond = max(peakPerSecond, n)
	}
	want := int(window/time.Second) * rate
	t.Logf("starts in %s: %d (limit %d, %.1f%%); most in any second: %d (limit %d); most running at once: %d (limit %d)",
		window, inWindow, want, 100*float64(inWindow)/float64(want), peakPerSecond, rate, probe.peak.Load(), concurrency)
	assert.LessOrEqual(t, inWindow, want*102/100, "starts exceed the rate by more than 2%")
	assert.GreaterOrEqual(t, inWindow, want*85/100, "the rate is far from used: jobs waited more than the limit asks")
	assert.LessOrEqual(t, int(probe.peak.Load()), concurrency, "more jobs of the kind ran at once than its fleet-wide concurrency")
	assert.LessOrEqual(t, peakPerSecond, rate+2, "starts bunch: one second saw more than the rate allows")

	// Waiting is visible and spends no attempt: a job that started on a
	// second attempt was held by the killed agent.
	heldByKilled := map[string]bool{}
	waiting := 0
	for _, ev := range f.events.All() {
		if ev.GetAgentId() == "limit-c" {
			heldByKilled[ev.GetJobId()] = true
		}
		if ev.GetType() == protocol.EventWaiting {
			waiting++
			assert.Contains(t, ev.GetReason(), "fleet-wide")
		}
		if ev.GetType() == protocol.EventFailed || ev.GetType() == protocol.EventDead {
			t.Errorf("job %s: %s (%s): a job over the limit must wait, not fail", ev.GetJobId(), ev.GetType(), ev.GetError())
		}
	}
	assert.Positive(t, waiting, "no job was seen waiting")
	// Only a delivery lost with the killed agent counts as an attempt. Most
	// of those jobs left an event of the killed agent's; the few it took
	// just before the kill may have had none out yet, but it never held more
	// than its concurrency, and no live agent saw their earlier attempt.
	firstOnLive := map[string]uint32{} // job → the first attempt a live agent reported
	for _, ev := range f.events.All() {
		if id := ev.GetJobId(); !strings.HasPrefix(ev.GetAgentId(), "limit-c") {
			if seen, ok := firstOnLive[id]; !ok || ev.GetAttempt() < seen {
				firstOnLive[id] = ev.GetAttempt()
			}
		}
	}
	var metUnseen []string
	for _, ev := range f.events.All() {
		if ev.GetType() == protocol.EventSucceeded && ev.GetAttempt() > 1 && !strings.HasPrefix(ev.GetAgentId(), "limit-c") &&
			!heldByKilled[ev.GetJobId()] {
			metUnseen = append(metUnseen, ev.GetJobId())
			seen := firstOnLive[ev.GetJobId()]
			assert.Equal(t, ev.GetAttempt(), seen,
				"job %s succeeded on attempt %d, and a live agent held its attempt %d: waiting spent an attempt", ev.GetJobId(), ev.GetAttempt(), seen)
		}
	}
	assert.LessOrEqual(t, len(metUnseen), cfg("limit-c").Concurrency,
		"jobs succeeded on a later attempt without an event of the killed agent: more than it could hold: %v", metUnseen)
}

// TestFleetWideConcurrencyIsReachedNeverExceededAndFreedByAKill runs a kind
// limited to 3 at once on three agents: 3 run, never more; an agent killed
// while it holds slots frees them when their TTL runs out, and every job
// succeeds.
func TestFleetWideConcurrencyIsReachedNeverExceededAndFreedByAKill(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{Queues: map[string]topology.QueueConfig{"default": {AckWait: 3 * time.Second}}})
	setLimit(t, f.js, "default", "render", protocol.KindLimit{Concurrency: 3})
	probe := &limitProbe{hold: 300 * time.Millisecond}
	register := func(a *agent.Agent) { must(t, a.Register("render", probe.handler, agent.KindOptions{})) }
	const jobs = 40
	for i := range jobs {
		fleettest.Publish(t, f.js, protocol.Job{ID: fmt.Sprintf("render-%02d", i), Queue: "default", Kind: "render"})
	}
	kill := f.startKillableAgent(t, agent.Config{ID: "render-c", Concurrency: 5}, register)
	// The killed agent takes slots first.
	f.events.Wait(t, 10*time.Second, func(ev *jetfleetpb.JobEvent) bool {
		return ev.GetAgentId() == "render-c" && ev.GetType() == protocol.EventSucceeded
	})
	kill()
	f.startAgent(t, agent.Config{ID: "render-a", Concurrency: 5}, register)
	f.startAgent(t, agent.Config{ID: "render-b", Concurrency: 5}, register)
	done := map[string]bool{}
	f.events.Wait(t, 90*time.Second, func(ev *jetfleetpb.JobEvent) bool {
		if ev.GetType() == protocol.EventSucceeded {
			done[ev.GetJobId()] = true
		}
		return len(done) == jobs
	})
	assert.Equal(t, int32(3), probe.peak.Load(), "the kind reached its fleet-wide concurrency and never went past it")
}

// TestInvalidLimitMakesJobsWaitAndSaysWhy: a limit document that is not
// valid (a rate of zero with a period) is never guessed at: the kind's jobs
// wait with the reason, and run once it is fixed.
func TestInvalidLimitMakesJobsWaitAndSaysWhy(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	kv, err := f.js.KeyValue(fleettest.Ctx(t, 5*time.Second), protocol.BucketLimits)
	require.NoError(t, err)
	_, err = kv.Put(fleettest.Ctx(t, 5*time.Second), protocol.LimitDefKey("default", "mail"), []byte(`{"rate":0,"period":"1m"}`))
	require.NoError(t, err)
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("mail", func(context.Context, *agent.Job) error { return nil }, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "mail-1", Queue: "default", Kind: "mail"})
	ev := f.events.WaitFor(t, 10*time.Second, "mail-1", protocol.EventWaiting)
	assert.Contains(t, ev.GetReason(), "invalid")
	assert.Contains(t, ev.GetReason(), "rate of zero")
	setLimit(t, f.js, "default", "mail", protocol.KindLimit{Rate: 10, Period: "1s"})
	f.events.WaitFor(t, 10*time.Second, "mail-1", protocol.EventSucceeded)
}

// TestFleetWideSlotOutlivesItsTTLWhileTheJobRuns: a job that runs longer
// than a slot's TTL keeps its slot (its agent renews it), so the next job
// of a kind limited to one waits for it to end.
func TestFleetWideSlotOutlivesItsTTLWhileTheJobRuns(t *testing.T) {
	t.Parallel()
	f := setup(t, topology.Config{})
	setLimit(t, f.js, "default", "report", protocol.KindLimit{Concurrency: 1})
	long := protocol.LimitSlotTTL + 5*time.Second
	var ends sync.Map
	f.startAgent(t, agent.Config{}, func(a *agent.Agent) {
		must(t, a.Register("report", func(ctx context.Context, job *agent.Job) error {
			if job.ID == "report-long" {
				select {
				case <-time.After(long): // the work
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			ends.Store(job.ID, time.Now())
			return nil
		}, agent.KindOptions{}))
	})
	fleettest.Publish(t, f.js, protocol.Job{ID: "report-long", Queue: "default", Kind: "report"})
	f.events.WaitFor(t, 10*time.Second, "report-long", protocol.EventStarted)
	fleettest.Publish(t, f.js, protocol.Job{ID: "report-next", Queue: "default", Kind: "report"})
	f.events.WaitFor(t, 10*time.Second, "report-next", protocol.EventWaiting)
	f.events.WaitFor(t, long+10*time.Second, "report-next", protocol.EventSucceeded)
	longEnd, _ := ends.Load("report-long")
	nextEnd, _ := ends.Load("report-next")
	require.NotNil(t, longEnd)
	require.NotNil(t, nextEnd)
	assert.True(t, nextEnd.(time.Time).After(longEnd.(time.Time)),
		"the second job ran while the first held the kind's only slot past its TTL")
}
