package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/embedded"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// haTopology uses a short lease so that failovers are quick.
var haTopology = topology.Config{LeaseTTL: 2 * time.Second}

// leaderWatch samples which replicas lead, to catch two at once.
type leaderWatch struct {
	mu      sync.Mutex
	rs      []*replica
	maxSeen int
	stop    chan struct{}
	done    chan struct{}
}

func watchLeaders(t *testing.T) *leaderWatch {
	w := &leaderWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(2 * time.Millisecond) // sampling an observation, not waiting for one
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			w.mu.Lock()
			n := 0
			for _, r := range w.rs {
				if r.IsLeader() {
					n++
				}
			}
			w.maxSeen = max(w.maxSeen, n)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(w.close)
	return w
}

func (w *leaderWatch) add(r *replica) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rs = append(w.rs, r)
}

func (w *leaderWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *leaderWatch) max() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxSeen
}

func (w *leaderWatch) live() []*replica {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*replica
	for _, r := range w.rs {
		if !r.stopped {
			out = append(out, r)
		}
	}
	return out
}

// TestFailoverFiresWithinLeaseTTL runs three competing replicas, kills the
// leader and measures how long the fleet goes without a fire.
func TestFailoverFiresWithinLeaseTTL(t *testing.T) {
	t.Parallel()
	f := newFleet(t, haTopology)
	leaders := watchLeaders(t)
	for range 3 {
		leaders.add(f.replica(scheduler.Config{}, clock.Real()))
	}
	leader := leaderOf(t, leaders.live()...)
	events := watchScheduleEvents(t, f.nc)
	_, err := f.client.AddSchedule(ctx(t, 10*time.Second), interval("beat", time.Second, "echo"))
	require.NoError(t, err)
	events.waitN(t, "beat", protocol.EventFired, 3)

	killedAt := time.Now()
	leader.kill()
	next := leaderOf(t, leaders.live()...)
	require.NotSame(t, leader, next)
	before := len(events.of("beat", protocol.EventFired))
	events.waitN(t, "beat", protocol.EventFired, before+1)

	var firstAfter time.Time
	var lastBefore int64
	msgs := f.jobMessages(t)
	for _, m := range msgs {
		n := nominalOf(t, m)
		if m.stored.Before(killedAt) {
			lastBefore = max(lastBefore, n)
		}
	}
	for _, m := range msgs {
		if nominalOf(t, m) > lastBefore && (firstAfter.IsZero() || m.stored.Before(firstAfter)) {
			firstAfter = m.stored
		}
	}
	gap := firstAfter.Sub(killedAt)
	t.Logf("first fire %s after the leader was killed (lease TTL %s)", gap, haTopology.LeaseTTL)
	assert.Less(t, gap, haTopology.LeaseTTL+time.Second, "a new leader fires within lease TTL + 1s")
	assert.Equal(t, 1, leaders.max(), "never two leaders at once")
}

func nominalOf(t *testing.T, m jobMessage) int64 {
	t.Helper()
	at, err := time.Parse(time.RFC3339, m.header.Get(protocol.HeaderNominalTime))
	require.NoError(t, err)
	return at.Unix()
}

// TestRepeatedLeaderKillsFireEveryNominalTimeExactlyOnce kills the leader
// over and over while schedules fire every second, replacing each killed
// replica. Every (schedule, nominal time) between the first and the last
// fire yields exactly one job message in JOBS: none doubled, none missed.
func TestRepeatedLeaderKillsFireEveryNominalTimeExactlyOnce(t *testing.T) {
	t.Parallel()
	f := newFleet(t, haTopology)
	leaders := watchLeaders(t)
	for range 3 {
		leaders.add(f.replica(scheduler.Config{}, clock.Real()))
	}
	events := watchScheduleEvents(t, f.nc)
	const schedules = 8
	var ids []string
	for i := range schedules {
		def := interval(fmt.Sprintf("s%d", i), time.Second, "echo")
		def.Policy.Misfire = jetfleet.MisfireFireAll
		_, err := f.client.AddSchedule(ctx(t, 10*time.Second), def)
		require.NoError(t, err)
		ids = append(ids, def.ID)
	}
	fired := func() int {
		n := 0
		for _, id := range ids {
			n += len(events.of(id, protocol.EventFired))
		}
		return n
	}
	kills := 0
	for fired() < 240 || kills < 5 {
		leader := leaderOf(t, leaders.live()...)
		// Let the leader fire a few rounds, then kill it mid-run.
		target := fired() + 2*schedules
		for _, id := range ids {
			events.waitN(t, id, protocol.EventFired, len(events.of(id, protocol.EventFired))+1)
		}
		for fired() < target {
			events.waitN(t, ids[0], protocol.EventFired, len(events.of(ids[0], protocol.EventFired))+1)
		}
		leader.kill()
		kills++
		leaders.add(f.replica(scheduler.Config{}, clock.Real()))
	}
	// Let the last leader catch up, then stop every replica.
	leaderOf(t, leaders.live()...)
	for _, id := range ids {
		events.waitN(t, id, protocol.EventFired, len(events.of(id, protocol.EventFired))+2)
	}
	for _, r := range leaders.live() {
		r.stop()
	}

	byID := map[string]int{}
	nominals := map[string][]int64{}
	for _, m := range f.jobMessages(t) {
		byID[m.id]++
		sid := m.header.Get(protocol.HeaderScheduleID)
		nominals[sid] = append(nominals[sid], nominalOf(t, m))
	}
	total := 0
	for id, n := range byID {
		assert.Equal(t, 1, n, "job %s has %d messages", id, n)
		total++
	}
	for _, id := range ids {
		ns := nominals[id]
		sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
		require.NotEmpty(t, ns, id)
		for i := 1; i < len(ns); i++ {
			assert.Equal(t, ns[i-1]+1, ns[i], "schedule %s: a nominal time is missing or doubled after %d", id, ns[i-1])
		}
	}
	t.Logf("%d job messages for %d schedules across %d leader kills", total, schedules, kills)
	assert.GreaterOrEqual(t, total, 200)
	assert.Equal(t, 1, leaders.max(), "never two leaders at once")
}

// TestStaleLeaderPublishIsRejectedAsDuplicate makes a replica that lost the
// race act on a stale view of a schedule: it publishes a nominal time the
// leader already fired. JetStream drops the message as a duplicate (same
// Nats-Msg-Id) and the stale state write fails its revision check, after
// which the replica reloads the state. It runs on one server and on a
// three-node cluster with R3 buckets, where conflicts carry another error code.
func TestStaleLeaderPublishIsRejectedAsDuplicate(t *testing.T) {
	t.Parallel()
	t.Run("single server", func(t *testing.T) {
		t.Parallel()
		staleLeaderTest(t, newFleet(t, topology.Config{}))
	})
	t.Run("three-node cluster, R3", func(t *testing.T) {
		t.Parallel()
		cluster := natstest.StartCluster(t, 3)
		staleLeaderTest(t, newFleetURL(t, cluster.URLs(), topology.Config{Replicas: 3}))
	})
}

func staleLeaderTest(t *testing.T, f *fleet) {
	clk := clock.NewFake(utc("2026-06-01T10:00:00Z"))
	a := f.replica(scheduler.Config{}, clk)
	waitLeading(t, a)
	b := f.replica(scheduler.Config{}, clk)
	c := ctx(t, 60*time.Second)
	_, err := f.client.AddSchedule(c, interval("stale", 10*time.Second, "echo"))
	require.NoError(t, err)
	require.NoError(t, a.WaitSynced(c))

	states, err := f.js.KeyValue(c, protocol.BucketScheduleState)
	require.NoError(t, err)
	clk.Set(utc("2026-06-01T10:00:10Z"))
	require.NoError(t, a.Kick(c))
	first, err := states.Get(c, "stale")
	require.NoError(t, err)
	clk.Set(utc("2026-06-01T10:00:20Z"))
	require.NoError(t, a.Kick(c))
	current, err := states.Get(c, "stale")
	require.NoError(t, err)
	require.NoError(t, b.WaitSynced(c))
	assert.False(t, b.IsLeader())

	nominal := utc("2026-06-01T10:00:20Z").Unix()
	res, err := b.ForceStaleFire(c, "stale", nominal, first.Revision())
	require.NoError(t, err)
	assert.True(t, res.Published, "the stale replica did publish")
	assert.True(t, res.Duplicate, "JetStream rejected the publish as a duplicate (PubAck.Duplicate)")
	assert.True(t, res.Reloaded, "the stale state write failed its revision check")
	assert.Equal(t, current.Revision(), res.CurrentRev, "the replica adopted the leader's state")
	assert.Equal(t, 1.0, counterValue(t, b.env.Telemetry.Registry, "jetfleet_scheduler_duplicates_total"))

	count := map[string]int{}
	for _, m := range f.jobMessages(t) {
		count[m.id]++
	}
	assert.Equal(t, map[string]int{"sched.stale.1780308010": 1, "sched.stale.1780308020": 1}, count)
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// TestFiresResumeRightAfterServerRestart: the NATS server goes away for
// longer than the leader's lease deadline, so the leader steps down while
// the server still holds its lease. Once the server is back the leader
// takes its lease back (nothing it sent while disconnected arrives late to
// move the lease on) and fires resume within 2 s.
func TestFiresResumeRightAfterServerRestart(t *testing.T) {
	t.Parallel()
	srv := natstest.RestartableServer(t, embedded.Options{})
	f := newFleetURL(t, srv.URL(), topology.Config{})
	r := f.replica(scheduler.Config{}, clock.Real())
	waitLeading(t, r)
	_, err := f.client.AddSchedule(ctx(t, 10*time.Second), interval("beat", time.Second, "echo"))
	require.NoError(t, err)
	lastFired := func() time.Time { // zero while the test's own connection is not back
		events, err := f.js.Stream(ctx(t, 5*time.Second), protocol.StreamEvents)
		if err != nil {
			return time.Time{}
		}
		m, err := events.GetLastMsgForSubject(ctx(t, 5*time.Second), protocol.ScheduleEventSubject("beat", protocol.EventFired))
		if err != nil {
			return time.Time{}
		}
		return m.Time
	}
	require.Eventually(t, func() bool { return !lastFired().IsZero() }, 10*time.Second, 50*time.Millisecond, "the schedule fires")

	srv.Stop()
	require.NoError(t, r.WaitLeading(ctx(t, 30*time.Second), false), "the leader steps down at its lease deadline")
	srv.Start(t)
	back := time.Now()
	var resumed time.Time
	require.Eventually(t, func() bool {
		resumed = lastFired()
		return resumed.After(back)
	}, 20*time.Second, 20*time.Millisecond, "fires resume")
	t.Logf("fires resumed %s after the server was back", resumed.Sub(back).Round(time.Millisecond))
	assert.Less(t, resumed.Sub(back), 2*time.Second)
	assert.True(t, r.IsLeader())
}

// TestFrozenLeaderWritesNothingWhenItResumes: a leader frozen past its lease
// deadline resumes with its timer due and with nominal times it now sees as
// misfired. The lease is no longer its own, so the pass publishes nothing:
// no job, no missed or fired event, no state, no miss in its metrics — the
// replica that leads meanwhile fired those times.
func TestFrozenLeaderWritesNothingWhenItResumes(t *testing.T) {
	t.Parallel()
	f := newFleet(t, topology.Config{})
	clk := clock.NewFake(utc("2026-06-01T10:00:00Z"))
	a := f.replica(scheduler.Config{}, clk)
	waitLeading(t, a)
	c := ctx(t, 60*time.Second)
	_, err := f.client.AddSchedule(c, interval("frozen", time.Second, "echo"))
	require.NoError(t, err)
	require.NoError(t, a.WaitSynced(c))
	clk.Set(utc("2026-06-01T10:00:01Z"))
	require.NoError(t, a.Kick(c))
	states, err := f.js.KeyValue(c, protocol.BucketScheduleState)
	require.NoError(t, err)
	before, err := states.Get(c, "frozen")
	require.NoError(t, err)
	eventsBefore := scheduleEventTypes(t, f, "frozen")
	require.Equal(t, 1, eventsBefore[protocol.EventFired])

	require.NoError(t, a.TickAfterLosingLease(c, func() { clk.Set(utc("2026-06-01T10:00:20Z")) }))
	require.NoError(t, a.WaitLeading(c, false))
	assert.Equal(t, eventsBefore, scheduleEventTypes(t, f, "frozen"), "the pass stored schedule events")
	after, err := states.Get(c, "frozen")
	require.NoError(t, err)
	assert.Equal(t, before.Revision(), after.Revision(), "the pass advanced the state")
	assert.Len(t, f.jobMessages(t), 1, "the pass published jobs")
	assert.Zero(t, counterValue(t, a.env.Telemetry.Registry, "jetfleet_scheduler_misses_total"))
}

// scheduleEventTypes counts the stored events of schedule id by type.
func scheduleEventTypes(t *testing.T, f *fleet, id string) map[string]int {
	t.Helper()
	c := ctx(t, 10*time.Second)
	cons, err := f.js.OrderedConsumer(c, protocol.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{"events.schedule." + id + ".>"}})
	require.NoError(t, err)
	out := map[string]int{}
	batch, err := cons.FetchNoWait(10000)
	require.NoError(t, err)
	for m := range batch.Messages() {
		var ev jetfleetpb.ScheduleEvent
		require.NoError(t, protocol.Unmarshal(m.Data(), &ev))
		out[ev.GetType()]++
	}
	require.NoError(t, batch.Error())
	return out
}

// TestFireWithUnknownOutcomeIsResolvedNotMissed: the job of a fire is sent,
// held on its way (a frozen connection) and stored after the leader gave up
// waiting for its answer. When the leader evaluates the schedule again, that
// nominal time is past the misfire threshold; it is not reported missed but
// fired again with the same job id, which JetStream recognises as the job it
// stored: one job, one fired event, and only the really missed times missed.
func TestFireWithUnknownOutcomeIsResolvedNotMissed(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	f := newFleetURL(t, srv.ClientURL(), topology.Config{})
	proxy := natstest.NewProxy(t, strings.TrimPrefix(srv.ClientURL(), "nats://"))
	clk := clock.NewFake(utc("2026-06-01T10:00:00Z"))
	a := f.replicaAt(proxy.URL(), scheduler.Config{PublishTimeout: 300 * time.Millisecond}, clk)
	waitLeading(t, a)
	c := ctx(t, 60*time.Second)
	events := watchScheduleEvents(t, f.nc)
	_, err := f.client.AddSchedule(c, interval("unsure", time.Second, "echo"))
	require.NoError(t, err)
	require.NoError(t, a.WaitSynced(c))

	proxy.Pause()
	clk.Set(utc("2026-06-01T10:00:01Z"))
	require.NoError(t, a.Kick(c)) // its answer does not come in time
	proxy.Unpause()
	require.Eventually(t, func() bool { return len(f.jobMessages(t)) == 1 }, 10*time.Second, 10*time.Millisecond,
		"the held job is stored")

	// 15 s later 10:00:01 to 10:00:05 are past the 10 s misfire threshold.
	clk.Set(utc("2026-06-01T10:00:16Z"))
	require.NoError(t, a.Kick(c))
	missed := events.waitN(t, "unsure", protocol.EventMissed, 1)[0]
	assert.Equal(t, utc("2026-06-01T10:00:05Z"), missed.GetNominalTime().AsTime().UTC())
	assert.Equal(t, uint32(4), missed.GetCount(), "10:00:02 to 10:00:05; 10:00:01 ran")
	fired := nominalTimes(events.waitN(t, "unsure", protocol.EventFired, 12))
	assert.Contains(t, fired, utc("2026-06-01T10:00:01Z"))
	count := map[string]int{}
	for _, m := range f.jobMessages(t) {
		count[m.id]++
	}
	assert.Equal(t, 1, count["sched.unsure.1780308001"])
	assert.Len(t, count, 12)
}

// TestFiresResumeSoonAfterTheJobsStreamElects: the node that leads JOBS in
// a three-node cluster is cut off from the others while the scheduler
// leader, connected to another node, fires every second. JOBS drops what is
// published to it, without an answer, until the other two nodes have
// elected a leader. The scheduler leader sends its batch's unanswered fires
// again after resend_after with no answer, so fires are stored within
// resend_after of the election, not after publish_timeout (30 s here).
func TestFiresResumeSoonAfterTheJobsStreamElects(t *testing.T) {
	t.Parallel()
	cluster := natstest.StartPartitionableCluster(t, 3)
	const survivor = 0
	// A lease that outlives the elections: only JOBS's election is measured.
	f := newFleetURL(t, cluster.Servers[survivor].ClientURL(), topology.Config{Replicas: 3, LeaseTTL: 30 * time.Second})
	c := ctx(t, 2*time.Minute)
	jobs, err := f.js.Stream(c, protocol.StreamJobs)
	require.NoError(t, err)
	victim := cluster.MoveStreamLeaderOff(t, f.js, protocol.StreamJobs, survivor)

	const publishTimeout, resendAfter = 30 * time.Second, 2 * time.Second
	r := f.replica(scheduler.Config{PublishTimeout: publishTimeout, ResendAfter: resendAfter, MisfireThreshold: time.Minute}, clock.Real())
	waitLeading(t, r)
	_, err = f.client.AddSchedule(c, interval("beat", time.Second, "echo"))
	require.NoError(t, err)
	lastStored := lastEchoStored(c, jobs)
	require.Eventually(t, func() bool { return !lastStored().IsZero() }, 10*time.Second, 50*time.Millisecond, "the schedule fires")

	cut, elected := cluster.CutUntilElected(t, f.js, protocol.StreamJobs, victim)
	var resumed time.Time
	require.Eventually(t, func() bool {
		resumed = lastStored()
		return resumed.After(cut)
	}, time.Minute, 20*time.Millisecond, "fires resume")
	t.Logf("JOBS elected %s after the cut; fires stored %s after the election", elected.Sub(cut).Round(time.Millisecond),
		resumed.Sub(elected).Round(time.Millisecond))
	// The first copy sent after the election can still meet a leader not yet
	// taking writes (CI, loaded: 4.99 s): the one after it is the bound.
	// Without the resend, fires waited out publish_timeout: 23.9 s.
	assert.Less(t, resumed.Sub(elected), 2*resendAfter+2*time.Second, "fires resumed late after the election")
	assert.True(t, r.IsLeader())
}

// TestFiresResumeWithinTheLeaseTTLWhenTheLeadersServerIsCutOff: in a
// three-node cluster, the scheduler leader reaches the nodes through proxies
// (as services reach nodes over a network) and the server it is connected to
// is made the leader of every stream the leader fires through. The leader
// moves them off its server (replica.LeadersElsewhere); then that server is
// cut off from the others and from its clients. The leader leaves the silent
// server for another and fires again within lease TTL + 2 s of the cut,
// keeping its lease. Had the cut server still led the streams, the others
// would first have to elect leaders for them (4-9 s in nats-server), past
// the TTL.
//
// Not parallel: the bound is a time, and the other tests' load on a small
// machine is not what the test measures.
func TestFiresResumeWithinTheLeaseTTLWhenTheLeadersServerIsCutOff(t *testing.T) {
	cluster := natstest.StartPartitionableCluster(t, 3)
	const ttl = 5 * time.Second // the production default
	f := newFleetURL(t, cluster.URLs(), topology.Config{Replicas: 3, LeaseTTL: ttl})
	c := ctx(t, 2*time.Minute)
	leader := f.replicaAt(cluster.ClientURLs(t), scheduler.Config{}, clock.Real())
	waitLeading(t, leader)
	leaderNode := slices.IndexFunc(cluster.Servers, func(s *server.Server) bool { return s.Name() == leader.env.Conn.ConnectedServerName() })
	require.GreaterOrEqual(t, leaderNode, 0, "the leader is connected to a node of the cluster")
	other := (leaderNode + 1) % 3
	follower := f.replicaAt(cluster.Servers[other].ClientURL(), scheduler.Config{}, clock.Real())

	// The leader moves nothing in its first interval on a server: it has
	// just won the lease. Nothing but the leader moves leaders after this.
	for _, stream := range scheduler.FirePath {
		cluster.MoveStreamLeaderTo(t, f.js, stream, leaderNode)
	}
	require.Eventually(t, func() bool {
		for _, stream := range scheduler.FirePath {
			if l := natstest.StreamLeader(c, f.js, stream); l == "" || l == cluster.Servers[leaderNode].Name() {
				return false
			}
		}
		return true
	}, 15*time.Second, 100*time.Millisecond, "the leader moves the fire path's streams off its server")

	// Read from a node that stays with the majority.
	_, reader := natstest.JetStream(t, cluster.Servers[other])
	jobs, err := reader.Stream(c, protocol.StreamJobs)
	require.NoError(t, err)
	_, err = f.client.AddSchedule(c, interval("beat", time.Second, "echo"))
	require.NoError(t, err)
	lastStored := lastEchoStored(c, jobs)
	require.Eventually(t, func() bool { return !lastStored().IsZero() }, 10*time.Second, 50*time.Millisecond, "the schedule fires")

	cluster.Cut(leaderNode)
	cut := time.Now()
	var resumed time.Time
	require.Eventually(t, func() bool {
		resumed = lastStored()
		return resumed.After(cut)
	}, time.Minute, 20*time.Millisecond, "fires resume")
	t.Logf("fires stored again %s after the leader's server was cut off (lease TTL %s)", resumed.Sub(cut).Round(time.Millisecond), ttl)
	assert.Less(t, resumed.Sub(cut), ttl+2*time.Second, "fires resume within lease TTL + 2 s")
	assert.True(t, leader.IsLeader() != follower.IsLeader(), "one replica leads")
}

// lastEchoStored returns a func that reads when JOBS stored its last job of
// kind echo in queue default: zero while JOBS has no leader to answer.
func lastEchoStored(c context.Context, jobs jetstream.Stream) func() time.Time {
	return func() time.Time {
		rc, cancel := context.WithTimeout(c, time.Second)
		defer cancel()
		m, err := jobs.GetLastMsgForSubject(rc, protocol.JobSubject("default", "echo"))
		if err != nil {
			return time.Time{}
		}
		return m.Time
	}
}
