package supervisor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// agentView is what the supervisor knows of one agent process: one
// incarnation (started_at and pid) of an agent id.
type agentView struct {
	hb       *jetfleetpb.Heartbeat
	lastSeen time.Time // supervisor clock, when the latest heartbeat arrived
	// dead: silent past the threshold. A follower marks dead on silence
	// alone; only a confirmed death is acted on.
	dead   bool
	deadAt time.Time
	// confirmed is set when this replica, leading, established the death:
	// nothing listens on the agent's control subject; or the agent did not
	// answer a ping while the supervisor's own connection worked and every
	// heartbeat the server had sent it was read; or another process took
	// over the agent id.
	confirmed bool
	// rescued is set once every job of the dead agent was handled.
	rescued bool
	// handled lists the stream sequences of the dead agent's jobs already
	// rescued or found to have moved on.
	handled map[uint64]bool
}

// orphan is the view of an agent process replaced by a new process with
// the same agent id (a crash and a restart).
type orphan struct {
	id   string
	view *agentView
}

// goneAgent is an agent that deregistered, and its last heartbeat.
type goneAgent struct {
	at time.Time
	hb *jetfleetpb.Heartbeat
}

// seenDelivery is the newest delivery of a job message seen in any heartbeat.
type seenDelivery struct {
	delivered uint64
	agent     string
	// first is when a heartbeat first listed this delivery (supervisor
	// clock): only a heartbeat received well after it can show that an
	// earlier delivery is still held (see ackOverdueLocked). last is when
	// one last listed it.
	first, last time.Time
}

// deliveryKey names one delivery of a job message.
type deliveryKey struct {
	seq       uint64
	delivered uint64
}

// overdueState tracks an attempt past its deadline.
type overdueState struct {
	agent    string
	job      *jetfleetpb.InFlightJob
	cancelAt time.Time
	// eventStored: the timed_out event of this delivery is stored; only the
	// timeout action (NAK or dead letter) may remain.
	eventStored bool
	failed      bool
	lastSeen    time.Time
}

// tracker follows the agents from their heartbeats (core NATS) and their
// registrations (bucket agents), declares silent agents dead, and (leader)
// rescues their jobs and handles overdue attempts.
type tracker struct {
	s   *Supervisor
	sub *nats.Subscription
	// observed counts the messages the heartbeat subscription has handled;
	// see caughtUp.
	observed atomic.Int64

	mu     sync.Mutex
	agents map[string]*agentView
	// orphans are replaced processes whose jobs are still to be rescued.
	orphans []orphan
	gone    map[string]goneAgent // deregistered agents
	seen    map[uint64]seenDelivery
	// starts is when each listed delivery's attempt started, on the
	// supervisor's clock: deadlines are measured as durations on it, so
	// the hosts' clocks need not agree.
	starts  map[deliveryKey]time.Time
	overdue map[deliveryKey]*overdueState
	// unnaked lists deliveries whose rescued event this replica stored
	// but which it did not NAK (the agent spoke again, or leadership was
	// lost): that event does not mean the delivery was released.
	unnaked  map[deliveryKey]bool
	reported map[deliveryKey]bool
	// stalled is set while silent agents cannot be judged because the
	// supervisor's own connection does not answer (logged once).
	stalled bool
}

func newTracker(s *Supervisor) *tracker {
	return &tracker{s: s, agents: map[string]*agentView{}, gone: map[string]goneAgent{},
		seen: map[uint64]seenDelivery{}, starts: map[deliveryKey]time.Time{}, overdue: map[deliveryKey]*overdueState{},
		unnaked: map[deliveryKey]bool{}, reported: map[deliveryKey]bool{}}
}

// start subscribes to heartbeats and watches the registry; registrations
// already stored are loaded as agents last seen when they were written.
func (t *tracker) start(ctx context.Context) error {
	sub, err := t.s.nc.Subscribe(protocol.HeartbeatsSubjects, func(m *nats.Msg) {
		defer t.observed.Add(1)
		var hb jetfleetpb.Heartbeat
		if err := protocol.Unmarshal(m.Data, &hb); err != nil {
			t.s.log.Debug("unreadable heartbeat", "subject", m.Subject, telemetry.LogError, err)
			return
		}
		id, err := protocol.ParseHeartbeatSubject(m.Subject)
		if err != nil || id != hb.GetAgentId() {
			return
		}
		t.observe(&hb, t.s.clk.Now())
	})
	if err != nil {
		return err
	}
	_ = sub.SetPendingLimits(-1, 64<<20)
	t.sub = sub
	w, err := t.s.agentsKV.WatchAll(ctx)
	if err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	t.s.runner.Go(func(ctx context.Context) {
		defer func() { _ = sub.Unsubscribe() }()
		for {
			err := t.follow(ctx, w)
			_ = w.Stop()
			if err == nil || ctx.Err() != nil {
				return
			}
			t.s.log.Warn("cannot read the agent registry; reading it again", telemetry.LogError, err)
			for w = nil; w == nil && ctx.Err() == nil; {
				sleepCtx(ctx, time.Second)
				w, _ = t.s.agentsKV.WatchAll(ctx)
			}
			if w == nil {
				return
			}
		}
	})
	return nil
}

// follow loads the registrations stored now through watcher w, then
// applies their changes until ctx ends or w closes. Only a failed load is
// an error: the caller reads the registry again.
func (t *tracker) follow(ctx context.Context, w jetstream.KeyWatcher) error {
	var initial []jetstream.KeyValueEntry
	collect := func(e jetstream.KeyValueEntry) { initial = append(initial, e) }
	if err := protocol.AwaitCurrent(ctx, t.s.js, protocol.BucketAgents, ">", w, collect); err != nil {
		return err
	}
	t.load(initial)
	t.s.agentsLoaded.Store(true)
	for {
		select {
		case <-ctx.Done():
			return nil
		case entry, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if entry != nil {
				t.applyEntry(entry, 0)
			}
		}
	}
}

// load applies the registrations stored when the supervisor started. Their
// age is measured on the server's clock against the newest of them (a
// registration stored 5 s before the newest one was last seen 5 s ago), so
// no host clock is compared with the server's. When every agent is gone the
// newest counts as fresh: the agents are probed a threshold later.
func (t *tracker) load(entries []jetstream.KeyValueEntry) {
	var newest time.Time
	for _, e := range entries {
		if e.Operation() == jetstream.KeyValuePut && e.Created().After(newest) {
			newest = e.Created()
		}
	}
	for _, e := range entries {
		t.applyEntry(e, max(newest.Sub(e.Created()), 0))
	}
}

// applyEntry handles one change of bucket agents: a registration (a
// heartbeat, stored age ago) or a deletion, which a stopping agent makes
// once it handed its jobs back itself.
func (t *tracker) applyEntry(entry jetstream.KeyValueEntry, age time.Duration) {
	now := t.s.clk.Now()
	if entry.Operation() != jetstream.KeyValuePut {
		id := entry.Key()
		t.mu.Lock()
		g := goneAgent{at: now}
		if a, ok := t.agents[id]; ok {
			g.hb = a.hb
			if !a.confirmed {
				delete(t.agents, id) // a confirmed death keeps its rescue; handed-back jobs show as settled
			}
		}
		t.gone[id] = g
		t.mu.Unlock()
		t.s.log.Info("agent deregistered", telemetry.LogAgentID, id)
		return
	}
	var hb jetfleetpb.Heartbeat
	if err := protocol.Unmarshal(entry.Value(), &hb); err != nil || hb.GetAgentId() != entry.Key() {
		return
	}
	t.observe(&hb, now.Add(-age))
}

// sameIncarnation reports whether two heartbeats come from one process.
func sameIncarnation(a, b *jetfleetpb.Heartbeat) bool {
	return a.GetStartedAt().AsTime().Equal(b.GetStartedAt().AsTime()) && a.GetPid() == b.GetPid()
}

// observe records a heartbeat received at seen.
func (t *tracker) observe(hb *jetfleetpb.Heartbeat, seen time.Time) {
	id := hb.GetAgentId()
	t.mu.Lock()
	defer t.mu.Unlock()
	if g, gone := t.gone[id]; gone {
		if hb.GetDraining() || (g.hb != nil && sameIncarnation(g.hb, hb)) {
			return // a late heartbeat of an agent that deregistered
		}
		delete(t.gone, id) // the id is in use again
	}
	a := t.agents[id]
	switch {
	case a == nil:
		a = &agentView{}
		t.agents[id] = a
	case !sameIncarnation(a.hb, hb):
		if hb.GetStartedAt().AsTime().Before(a.hb.GetStartedAt().AsTime()) {
			t.earlierProcessLocked(id, hb)
			return
		}
		t.orphanLocked(id, a, seen)
		a = &agentView{}
		t.agents[id] = a
	case hb.GetSequence() <= a.hb.GetSequence():
		return // the registration of a heartbeat already seen, or an older one
	}
	if a.dead {
		t.s.log.Warn("agent declared dead sends heartbeats again; jobs already released are redelivered",
			telemetry.LogAgentID, id, "dead_for", seen.Sub(a.deadAt).String())
		a.dead, a.confirmed, a.rescued, a.handled = false, false, false, nil
	}
	a.hb = hb
	if seen.After(a.lastSeen) {
		a.lastSeen = seen
	}
	for _, j := range hb.GetJobs() {
		seq := j.GetStreamSequence()
		if sd, ok := t.seen[seq]; !ok || j.GetDelivered() > sd.delivered {
			t.seen[seq] = seenDelivery{delivered: j.GetDelivered(), agent: id, first: seen, last: seen}
		} else if j.GetDelivered() == sd.delivered {
			sd.agent = id
			if seen.After(sd.last) {
				sd.last = seen
			}
			t.seen[seq] = sd
		}
		k := deliveryKey{seq, j.GetDelivered()}
		if _, ok := t.starts[k]; !ok && j.GetDeadline() != nil && j.GetStartedAt() != nil {
			// How long the attempt had run when the heartbeat was sent,
			// on the agent's clock alone; the transit makes the estimate
			// late, never early.
			var ran time.Duration
			if hb.GetSentAt() != nil {
				ran = max(hb.GetSentAt().AsTime().Sub(j.GetStartedAt().AsTime()), 0)
			}
			t.starts[k] = seen.Add(-ran)
		}
	}
}

// orphanLocked sets aside the view of an agent process that a new process
// with the same agent id replaced. The old process cannot hold its jobs any
// more (they arrived on its connection), so they are rescued without
// waiting for the silence threshold — once it has been silent for one of
// its intervals, which a second process wrongly sharing the id would not be.
func (t *tracker) orphanLocked(id string, a *agentView, now time.Time) {
	if (a.dead && a.rescued) || len(a.hb.GetJobs()) == 0 {
		return
	}
	if !a.dead {
		a.dead, a.deadAt = true, now
	}
	a.confirmed = true
	t.orphans = append(t.orphans, orphan{id: id, view: a})
	t.s.log.Warn("agent restarted with the same id; the jobs of its previous process are rescued",
		telemetry.LogAgentID, id, "previous_pid", a.hb.GetPid(), "previous_started_at", a.hb.GetStartedAt().AsTime(),
		"jobs", len(a.hb.GetJobs()))
}

// earlierProcessLocked handles a heartbeat of a process older than the one
// the view follows: a late one, or a second process using the same id.
func (t *tracker) earlierProcessLocked(id string, hb *jetfleetpb.Heartbeat) {
	for i, o := range t.orphans {
		if o.id == id && sameIncarnation(o.view.hb, hb) {
			t.s.log.Error("two processes send heartbeats as one agent id; the older one's jobs are not rescued",
				telemetry.LogAgentID, id, "pid", hb.GetPid(), "started_at", hb.GetStartedAt().AsTime())
			o.view.dead, o.view.confirmed = false, false // checked before each NAK
			t.orphans = slices.Delete(t.orphans, i, i+1)
			return
		}
	}
}

// interval is an agent's promised heartbeat interval.
func interval(hb *jetfleetpb.Heartbeat) time.Duration {
	if d := hb.GetInterval().AsDuration(); d > 0 {
		return d
	}
	return time.Second
}

// deadAfter is how long an agent may stay silent. A draining agent gets
// twice as long: it is about to deregister, and between its last heartbeat
// and its deregistration it no longer answers its control subject.
func (t *tracker) deadAfter(hb *jetfleetpb.Heartbeat) time.Duration {
	d := time.Duration(t.s.cfg.MissedHeartbeats) * interval(hb)
	if hb.GetDraining() {
		d *= 2
	}
	return d
}

// rescueTarget is a dead agent process whose jobs are to be rescued.
type rescueTarget struct {
	id   string
	view *agentView
}

// check is one liveness pass: silent agents are probed (leader) and
// declared dead, the jobs of dead agents rescued (leader), overdue attempts
// cancelled and failed (leader), and ack-overdue deliveries listed.
func (t *tracker) check(ctx context.Context, now time.Time, leader bool) {
	var silent, suspects []string
	var rescue []rescueTarget
	retention := t.s.cfg.DeadAgentRetention
	t.mu.Lock()
	for id, a := range t.agents {
		switch {
		case a.dead:
			if now.Sub(a.deadAt) > retention {
				delete(t.agents, id)
				continue
			}
			if leader && !a.rescued {
				if a.confirmed {
					rescue = append(rescue, rescueTarget{id, a})
				} else {
					suspects = append(suspects, id) // a follower's verdict: probe first
				}
			}
		case now.Sub(a.lastSeen) > t.deadAfter(a.hb):
			silent = append(silent, id)
		}
	}
	kept := t.orphans[:0]
	for _, o := range t.orphans {
		if o.view.rescued || !o.view.dead || now.Sub(o.view.deadAt) > retention {
			continue
		}
		kept = append(kept, o)
		if leader && now.Sub(o.view.lastSeen) >= interval(o.view.hb) {
			rescue = append(rescue, rescueTarget(o))
		}
	}
	clear(t.orphans[len(kept):])
	t.orphans = kept
	for id, g := range t.gone {
		if now.Sub(g.at) > retention {
			delete(t.gone, id)
		}
	}
	for seq, sd := range t.seen {
		if now.Sub(sd.last) > retention {
			delete(t.seen, seq)
		}
	}
	for k := range t.unnaked {
		if _, ok := t.seen[k.seq]; !ok {
			delete(t.unnaked, k)
		}
	}
	t.mu.Unlock()

	var unjudged []string
	if len(silent)+len(suspects) > 0 {
		declared, notJudged := t.probe(ctx, silent, suspects, leader)
		rescue, unjudged = append(rescue, declared...), notJudged
	}
	t.mu.Lock()
	wasStalled := t.stalled
	t.stalled = len(unjudged) > 0
	t.mu.Unlock()
	switch {
	case len(unjudged) > 0 && !wasStalled:
		t.s.log.Warn("silent agents not judged: the supervisor's own connection does not answer in time",
			"agents", unjudged, "probe_timeout", t.s.cfg.ProbeTimeout.String())
	case len(unjudged) == 0 && wasStalled:
		t.s.log.Info("the supervisor's connection answers again; silent agents are judged")
	}
	t.updateGauges()
	if leader {
		sort.Slice(rescue, func(i, j int) bool { return rescue[i].id < rescue[j].id })
		for _, r := range rescue {
			t.rescue(ctx, r.id, r.view)
		}
	}
	t.checkJobs(ctx, now, leader)
}

func (t *tracker) updateGauges() {
	t.mu.Lock()
	alive, dead := 0, 0
	for _, a := range t.agents {
		if a.dead {
			dead++
		} else {
			alive++
		}
	}
	t.mu.Unlock()
	t.s.metrics.agentsLive.Store(int64(alive))
	t.s.metrics.agentsDead.Store(int64(dead))
}

// pingResult is what a ping of a silent agent showed.
type pingResult int

const (
	// pingUnanswered: no reply in time. The agent is stuck, or the
	// supervisor's own connection is.
	pingUnanswered pingResult = iota
	// pingAnswered: the agent is alive, merely slow to send heartbeats.
	pingAnswered
	// pingNoResponders: no process listens on the agent's control subject.
	pingNoResponders
)

// probe judges silent agents and the leader's suspects (agents a follower
// marked dead without probing). It returns the deaths it confirmed, and
// the agents it could not judge because the supervisor's own connection
// did not answer.
// Followers only mark silent agents dead in their view. The leader pings:
// an answer proves an agent alive; no responder proves it gone; no answer
// proves it stuck only when the supervisor's own connection is healthy and
// every heartbeat the server had sent it has been read (caughtUp) — a
// supervisor whose connection stalls sees every agent silent and must not
// release their jobs.
func (t *tracker) probe(ctx context.Context, silent, suspects []string, leader bool) (declared []rescueTarget, unjudged []string) {
	s := t.s
	if !leader {
		now := s.clk.Now()
		var marked []string
		t.mu.Lock()
		for _, id := range silent {
			if a := t.agents[id]; a != nil && !a.dead && now.Sub(a.lastSeen) > t.deadAfter(a.hb) {
				a.dead, a.deadAt = true, now
				marked = append(marked, id)
			}
		}
		t.mu.Unlock()
		for _, id := range marked {
			s.log.Warn("agent declared dead", telemetry.LogAgentID, id, "missed_heartbeats", s.cfg.MissedHeartbeats, "probed", false)
		}
		return nil, nil
	}
	ids := append(slices.Clone(silent), suspects...)
	before := make([]time.Time, len(ids))
	t.mu.Lock()
	for i, id := range ids {
		if a := t.agents[id]; a != nil {
			before[i] = a.lastSeen
		}
	}
	t.mu.Unlock()
	results := make([]pingResult, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() { results[i] = t.ping(ctx, id) })
	}
	wg.Wait()
	healthy := true
	if slices.Contains(results, pingUnanswered) {
		healthy = t.caughtUp(ctx)
	}
	now := s.clk.Now()
	var alive []string
	t.mu.Lock()
	for i, id := range ids {
		a := t.agents[id]
		if a == nil || a.confirmed || !a.lastSeen.Equal(before[i]) {
			continue // gone, decided, or it spoke meanwhile
		}
		switch results[i] {
		case pingAnswered:
			a.lastSeen = now // slow heartbeats, live agent
			a.dead = false
			alive = append(alive, id)
			continue
		case pingUnanswered:
			if !healthy {
				unjudged = append(unjudged, id)
				continue
			}
		}
		if !a.dead && now.Sub(a.lastSeen) <= t.deadAfter(a.hb) {
			continue
		}
		if !a.dead {
			a.dead, a.deadAt = true, now
		}
		a.confirmed = true
		declared = append(declared, rescueTarget{id, a})
	}
	t.mu.Unlock()
	for _, id := range alive {
		s.log.Warn("agent missed heartbeats but answers; not declared dead", telemetry.LogAgentID, id)
	}
	for _, d := range declared {
		s.log.Warn("agent declared dead", telemetry.LogAgentID, d.id, "missed_heartbeats", s.cfg.MissedHeartbeats, "probed", true)
		if s.cfg.Alerts.AgentDead != SeverityNone {
			s.alerter.raise(ctx, &jetfleetpb.Alert{Key: "agent_dead:" + d.id, Type: "agent_dead", Severity: s.cfg.Alerts.AgentDead,
				AgentId: d.id, Summary: fmt.Sprintf("agent %s stopped sending heartbeats and does not answer; its jobs are rescued", d.id)})
		}
	}
	return declared, unjudged
}

// ping asks the agent's control subject whether anyone is there.
func (t *tracker) ping(ctx context.Context, id string) pingResult {
	data, _ := protocol.Marshal(&jetfleetpb.AgentCommand{Action: protocol.CommandPing})
	pctx, cancel := context.WithTimeout(ctx, t.s.cfg.ProbeTimeout)
	defer cancel()
	_, err := t.s.nc.RequestWithContext(pctx, protocol.ControlSubject(id), data)
	switch {
	case err == nil:
		return pingAnswered
	case errors.Is(err, nats.ErrNoResponders):
		return pingNoResponders
	default:
		return pingUnanswered
	}
}

// caughtUp reports whether the supervisor's own connection works and every
// heartbeat the server had sent it before now has been observed: a round
// trip to the server (its PONG follows everything it sent before), then the
// heartbeat subscription's backlog up to that point. A silence still there
// afterwards is the agent's, not the supervisor's. Bounded by probe_timeout.
func (t *tracker) caughtUp(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, t.s.cfg.ProbeTimeout)
	defer cancel()
	if err := t.s.nc.FlushWithContext(cctx); err != nil {
		return false
	}
	// Read in this order, a message moving from pending to delivered in
	// between is counted twice: the wait can only get longer.
	delivered, err := t.sub.Delivered()
	if err != nil {
		return false
	}
	pending, _, err := t.sub.Pending()
	if err != nil {
		return false
	}
	target := delivered + int64(pending)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for t.observed.Load() < target {
		select {
		case <-cctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}
