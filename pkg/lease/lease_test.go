package lease

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/fleettest"
	"github.com/jetfleet/jetfleet/pkg/natsconn"
	"github.com/jetfleet/jetfleet/pkg/natstest"
)

const testTTL = 2 * time.Second

// changes records an elector's leadership changes.
type changes struct {
	mu     sync.Mutex
	events []bool
	gained chan struct{}
}

func (c *changes) record(leading bool) {
	c.mu.Lock()
	c.events = append(c.events, leading)
	c.mu.Unlock()
	if leading {
		select {
		case c.gained <- struct{}{}:
		default:
		}
	}
}

func (c *changes) list() []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]bool(nil), c.events...)
}

func newBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, js := natstest.JetStream(t, natstest.Server(t))
	kv, err := js.CreateKeyValue(fleettest.Ctx(t, 10*time.Second), jetstream.KeyValueConfig{Bucket: "leases", TTL: testTTL})
	require.NoError(t, err)
	return kv
}

// start runs an elector until the test ends and returns its changes.
func start(t *testing.T, kv jetstream.KeyValue, holder string) (*Elector, *changes) {
	t.Helper()
	return startWith(t, Config{KV: kv, Key: "svc", Holder: holder, Role: "test", TTL: testTTL,
		Renew: testTTL / 4, Acquire: testTTL / 20, Log: fleettest.Logger(t)})
}

// startWith runs an elector of cfg, its changes recorded, until the test
// ends.
func startWith(t *testing.T, cfg Config) (*Elector, *changes) {
	t.Helper()
	ch := &changes{gained: make(chan struct{}, 1)}
	cfg.OnChange = ch.record
	el := New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); el.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return el, ch
}

func waitGained(t *testing.T, ch *changes, timeout time.Duration) {
	t.Helper()
	select {
	case <-ch.gained:
	case <-time.After(timeout):
		t.Fatalf("leadership not gained within %s", timeout)
	}
}

// TestOneLeaderAndAReleasedLeaseIsTakenAtOnce: of two replicas one leads;
// when it resigns and releases the lease, the other leads well before the
// TTL could have dropped the key.
func TestOneLeaderAndAReleasedLeaseIsTakenAtOnce(t *testing.T) {
	kv := newBucket(t)
	a, aCh := start(t, kv, "a")
	waitGained(t, aCh, 5*time.Second)
	b, bCh := start(t, kv, "b")
	require.True(t, a.IsLeader())
	// b tries every TTL/20; after several attempts it still follows.
	deadline := time.Now().Add(testTTL / 2)
	for time.Now().Before(deadline) {
		require.False(t, a.IsLeader() && b.IsLeader(), "two leaders at once")
		select {
		case <-bCh.gained:
			t.Fatal("b took a lease a holds")
		case <-time.After(testTTL / 20):
		}
	}

	released := time.Now()
	a.Resign()
	assert.False(t, a.IsLeader(), "IsLeader is false as soon as Resign returns")
	a.Release(fleettest.Ctx(t, 5*time.Second))
	waitGained(t, bCh, testTTL)
	assert.Less(t, time.Since(released), testTTL/2, "b waited for the TTL instead of taking the released lease")
	assert.True(t, b.IsLeader())
	assert.False(t, a.IsLeader())
}

// TestRenewalWithALostReplyKeepsTheLease: a renewal is stored but its reply
// never reaches the leader, whose next renewal then expects an old
// revision. The leader finds the lease still its own, adopts the revision and
// renews on: it neither steps down nor leaves the service without a leader.
func TestRenewalWithALostReplyKeepsTheLease(t *testing.T) {
	kv := newBucket(t)
	el, ch := start(t, kv, "a")
	waitGained(t, ch, 5*time.Second)
	ctx := fleettest.Ctx(t, 30*time.Second)
	w, err := kv.Watch(ctx, "svc")
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()

	unseen := renewUnseen(t, ctx, el)
	renewals := 0
	for kve := range w.Updates() {
		if kve == nil || kve.Revision() <= unseen {
			continue
		}
		var v Value
		require.NoError(t, json.Unmarshal(kve.Value(), &v))
		require.Equal(t, "a", v.Holder)
		if renewals++; renewals == 2 {
			break // two renewals after the one the elector did not see
		}
	}
	assert.True(t, el.IsLeader())
	assert.Equal(t, []bool{true}, ch.list(), "leadership was gained once and never lost")
}

// TestLeaderWhoseLeaseIsTakenStepsDown: when another holder's value replaces
// the lease (as after an expiry this replica missed), the leader steps down
// at its next renewal.
func TestLeaderWhoseLeaseIsTakenStepsDown(t *testing.T) {
	kv := newBucket(t)
	el, ch := start(t, kv, "a")
	waitGained(t, ch, 5*time.Second)
	ctx := fleettest.Ctx(t, 10*time.Second)
	val, _ := json.Marshal(Value{Holder: "intruder", RenewedAt: time.Now()})
	_, err := kv.Put(ctx, "svc", val)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !el.IsLeader() }, testTTL, 10*time.Millisecond)
	// IsLeader turns false just before OnChange reports it.
	require.Eventually(t, func() bool { return len(ch.list()) >= 2 }, testTTL, 10*time.Millisecond, "the step-down was reported")
	assert.Equal(t, []bool{true, false}, ch.list()[:2])
}

// renewUnseen renews the lease the way a renewal whose reply was lost does:
// the write is stored and the elector does not learn its revision.
func renewUnseen(t *testing.T, ctx context.Context, el *Elector) uint64 {
	t.Helper()
	for {
		el.mu.Lock()
		rev := el.rev
		el.mu.Unlock()
		require.NotZero(t, rev, "not holding the lease")
		now := time.Now()
		newRev, err := el.write(ctx, rev, now, now, now.Add(time.Second))
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && ctx.Err() == nil {
			continue // the elector renewed meanwhile: use its revision
		}
		require.NoError(t, err)
		return newRev
	}
}

// TestOwnLeaseIsTakenBackAtOnce: a renewal the leader gave up on reaches the
// server late (it waited out a disconnection in a client buffer), so the
// leader's next renewal meets a revision it did not write, and the stored
// renewal is too old to adopt: the leader steps down. The key is still its
// own, so it takes it back at once with a revision-checked update, instead
// of leaving the service without a leader until the TTL drops the key.
func TestOwnLeaseIsTakenBackAtOnce(t *testing.T) {
	kv := newBucket(t)
	el, ch := start(t, kv, "a")
	waitGained(t, ch, 5*time.Second)
	ctx := fleettest.Ctx(t, 30*time.Second)

	stale, _ := json.Marshal(Value{Holder: "a", AcquiredAt: time.Now().Add(-testTTL), RenewedAt: time.Now().Add(-testTTL)})
	written := time.Now()
	_, err := kv.Put(ctx, "svc", stale)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(ch.list()) >= 2 }, testTTL, 10*time.Millisecond, "the stale renewal makes the leader step down")
	waitGained(t, ch, testTTL)
	assert.Less(t, time.Since(written), testTTL*3/4, "the lease was taken back only once the TTL dropped it")
	assert.Equal(t, []bool{true, false, true}, ch.list())
	assert.True(t, el.IsLeader())
	lease, err := Read(ctx, kv, "svc")
	require.NoError(t, err)
	assert.Equal(t, "a", lease.Holder)
	assert.True(t, lease.RenewedAt.After(written), "renewed after the stale write")
}

// TestForeignLeaseIsNotTakenBack: a key another holder wrote is not taken
// back: this replica leads only once the TTL dropped it.
func TestForeignLeaseIsNotTakenBack(t *testing.T) {
	kv := newBucket(t)
	ctx := fleettest.Ctx(t, 30*time.Second)
	val, _ := json.Marshal(Value{Holder: "b", RenewedAt: time.Now()})
	written := time.Now()
	_, err := kv.Create(ctx, "svc", val)
	require.NoError(t, err)
	_, ch := start(t, kv, "a")
	waitGained(t, ch, 2*testTTL)
	assert.GreaterOrEqual(t, time.Since(written), testTTL-testTTL/10, "a led while b's lease lived")
}

// TestLeaseOutlivesItsServerGoingSilent: the leader's server stops
// answering (a partition: no reset, no FIN) and the client moves to
// another server. A renewal sent on the silent connection never gets its
// reply; it must not hold the lease's fate until the deadline: once the
// connection has moved, the next attempt, on the new connection, renews
// it, and leadership is never lost.
func TestLeaseOutlivesItsServerGoingSilent(t *testing.T) {
	t.Parallel()
	// Renewals every 2.5 s, the deadline 8 s after the last one confirmed;
	// a silent connection is left after 2.8-4.2 s (2 pings of 1.4 s): a
	// renewal is certain to go out on it, and a renewal sent again on the
	// new connection has time to land.
	const ttl, ping = 10 * time.Second, 1400 * time.Millisecond
	srv := natstest.Server(t)
	target := strings.TrimPrefix(srv.ClientURL(), "nats://")
	proxies := map[string]*natstest.Proxy{}
	var urls []string
	for range 2 {
		p := natstest.NewProxy(t, target)
		proxies[p.URL()] = p
		urls = append(urls, p.URL())
	}
	nc, err := natsconn.Connect(natsconn.Config{URL: strings.Join(urls, ","), PingInterval: ping}, "lease", fleettest.Logger(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	reconnected := make(chan struct{}, 1)
	nc.SetReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} })
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := fleettest.Ctx(t, 60*time.Second)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leases", TTL: ttl})
	require.NoError(t, err)
	el, ch := startWith(t, Config{KV: kv, Key: "svc", Holder: "a", Role: "test", TTL: ttl, Renew: ttl / 4, Acquire: ttl / 20,
		Log: fleettest.Logger(t), Conn: nc})
	waitGained(t, ch, 10*time.Second)

	// Watch the key from a connection of its own, straight to the server,
	// to see renewals land.
	_, direct := natstest.JetStream(t, srv)
	directKV, err := direct.KeyValue(ctx, "leases")
	require.NoError(t, err)
	w, err := directKV.Watch(ctx, "svc", jetstream.UpdatesOnly())
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()

	// Right as a renewal lands (its reply may be lost with the connection).
	for kve := range w.Updates() {
		if kve != nil {
			break
		}
	}
	proxies[nc.ConnectedUrl()].Pause()
	select {
	case <-reconnected:
	case <-ctx.Done():
		t.Fatal("the client stayed on the silent server")
	}
	renewals := 0
	for kve := range w.Updates() {
		if kve == nil {
			continue
		}
		if renewals++; renewals == 3 {
			break // renewed three times on the new connection
		}
	}
	assert.True(t, el.IsLeader())
	assert.Equal(t, []bool{true}, ch.list(), "leadership was gained once and never lost")
}

// TestLeaseIsRenewedSoonAfterItsBucketElects: the node leading the lease
// bucket's stream is cut off from the others while the leader renews. The
// stream drops the renewal sent during its election without an answer; the
// renewal sent again once the others elected lands, and the leader never
// steps down. A renewal that only waited for its answer would wait until
// the lease's deadline (24 s here) and lose the lease.
func TestLeaseIsRenewedSoonAfterItsBucketElects(t *testing.T) {
	t.Parallel()
	const ttl, renew = 30 * time.Second, 2 * time.Second
	cluster := natstest.StartPartitionableCluster(t, 3)
	const survivor = 0
	nc, js := natstest.JetStream(t, cluster.Servers[survivor])
	ctx := fleettest.Ctx(t, 2*time.Minute)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leases", TTL: ttl, Replicas: 3})
	require.NoError(t, err)
	victim := cluster.MoveStreamLeaderOff(t, js, "KV_leases", survivor)

	el, ch := startWith(t, Config{KV: kv, Key: "svc", Holder: "a", Role: "test", TTL: ttl, Renew: renew, Acquire: renew,
		Log: fleettest.Logger(t), Conn: nc})
	waitGained(t, ch, 10*time.Second)
	revision := func() uint64 { // zero while the stream has no leader to answer
		rc, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		kve, err := kv.Get(rc, "svc")
		if err != nil {
			return 0
		}
		return kve.Revision()
	}
	// Cut right after a renewal landed: none lands before the cut after it.
	// A read can be answered by a replica that has not applied the lease's
	// creation yet (direct gets are served by followers too): read until
	// one has.
	var first uint64
	require.Eventually(t, func() bool { first = revision(); return first > 0 }, 10*time.Second, 10*time.Millisecond)
	var before uint64
	require.Eventually(t, func() bool { before = revision(); return before > first }, 10*time.Second, 10*time.Millisecond)

	cut, elected := cluster.CutUntilElected(t, js, "KV_leases", victim)
	var renewed time.Time
	require.Eventually(t, func() bool {
		renewed = time.Now()
		return revision() > before
	}, time.Minute, 20*time.Millisecond, "the lease is renewed")
	t.Logf("KV_leases elected %s after the cut; the lease renewed %s after the election", elected.Sub(cut).Round(time.Millisecond),
		renewed.Sub(elected).Round(time.Millisecond))
	// The first copy after the election can meet a leader not yet taking
	// writes: the one after it is the bound.
	assert.Less(t, renewed.Sub(elected), 2*renew+2*time.Second, "the lease was renewed late after the election")
	assert.True(t, el.IsLeader())
	assert.Equal(t, []bool{true}, ch.list(), "leadership was gained once and never lost")
}
