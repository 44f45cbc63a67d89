package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// hub is the dashboard process's one set of NATS subscriptions — every
// event (events.>), every alert, and watches of buckets schedules,
// schedule_state and agents — fanned out to any number of browsers as
// topics ("overview", "schedule:<id>", "job:<id>", …) over server-sent
// events. It also keeps what pages need that no API gives cheaply: a
// mirror of the schedule definitions and states, the recent alerts and
// missed or skipped fires, the rate of finished runs per queue and samples
// of the queues' backlog. Everything in it is rebuilt from NATS on start:
// replicas are interchangeable.
type hub struct {
	d  *Dashboard
	nc *nats.Conn

	subs     []*nats.Subscription
	watchers []jetstream.KeyWatcher

	mu        sync.Mutex
	schedules map[string]*jetfleet.Schedule
	states    map[string]*jetfleet.ScheduleState
	sorted    []string // schedule ids, sorted; nil when stale
	agentSig  map[string]string
	alerts    []*jetfleetpb.Alert         // newest last, at most ringSize
	fires     []*jetfleetpb.ScheduleEvent // missed and skipped, newest last
	out       map[string]*rateRing        // finished runs per queue
	backlog   map[string][]backlogSample
	status    *jetfleet.FleetStatus
	statusAt  time.Time
	dlqReason map[string]int
	dlqAt     time.Time
	dlqDepth  uint64
	started   time.Time

	// dirty topics since the last fan-out; followed: topics marked dirty
	// every live_interval until a time (followedAt: when last); clients by
	// topic.
	dirty      map[string]bool
	followed   map[string]time.Time
	followedAt time.Time
	clients    map[string]map[*liveClient]bool
	nclient    int
}

const ringSize = 50

type backlogSample struct {
	at   time.Time
	jobs uint64
}

// rateRing counts events per second over the last two minutes.
type rateRing struct {
	secs  [120]uint32
	stamp [120]int64
}

func (r *rateRing) add(now time.Time) {
	s := now.Unix()
	i := s % 120
	if r.stamp[i] != s {
		r.stamp[i], r.secs[i] = s, 0
	}
	r.secs[i]++
}

// perSecond is the mean rate over the last window seconds (complete ones).
func (r *rateRing) perSecond(now time.Time, window int) float64 {
	s := now.Unix()
	var n uint32
	for k := int64(1); k <= int64(window); k++ {
		i := (s - k) % 120
		if r.stamp[i] == s-k {
			n += r.secs[i]
		}
	}
	return float64(n) / float64(window)
}

type liveClient struct {
	notify chan string
}

func newHub(d *Dashboard) *hub {
	return &hub{d: d, nc: d.nc, schedules: map[string]*jetfleet.Schedule{}, states: map[string]*jetfleet.ScheduleState{},
		agentSig: map[string]string{}, out: map[string]*rateRing{}, backlog: map[string][]backlogSample{},
		dirty: map[string]bool{}, followed: map[string]time.Time{}, clients: map[string]map[*liveClient]bool{}}
}

// start subscribes, loads the recent alerts and fires, and starts the
// bucket watches; run (a goroutine) fans out and samples.
// The watches live as long as runCtx; ctx bounds the start.
func (h *hub) start(ctx, runCtx context.Context) error {
	h.started = time.Now()
	ctx, cancel := context.WithTimeout(ctx, 3*h.d.cfg.RequestTimeout)
	defer cancel()
	for subject, fn := range map[string]nats.MsgHandler{
		protocol.EventsSubjects: h.onEvent,
		protocol.AlertsSubjects: h.onAlert,
	} {
		sub, err := h.nc.Subscribe(subject, fn)
		if err != nil {
			return err
		}
		_ = sub.SetPendingLimits(1<<20, 256<<20) // fails only on a closed subscription or a zero limit
		h.subs = append(h.subs, sub)
	}
	if err := h.nc.FlushWithContext(ctx); err != nil {
		return err
	}
	h.loadRecent(ctx)
	for _, b := range []struct {
		bucket string
		fn     func(jetstream.KeyValueEntry)
	}{{protocol.BucketSchedules, h.onSchedule}, {protocol.BucketScheduleState, h.onState}, {protocol.BucketAgents, h.onAgent}} {
		kv, err := h.d.js.KeyValue(ctx, b.bucket)
		if err != nil {
			return err
		}
		w, err := kv.WatchAll(runCtx)
		if err != nil {
			return err
		}
		h.watchers = append(h.watchers, w)
		// The current values, before the first page is served.
		if err := protocol.AwaitCurrent(ctx, h.d.js, b.bucket, ">", w, b.fn); err != nil {
			return err
		}
		fn := b.fn
		h.d.runner.Go(func(ctx context.Context) {
			for {
				select {
				case <-ctx.Done():
					return
				case e, ok := <-w.Updates():
					if !ok {
						return
					}
					if e != nil {
						fn(e)
					}
				}
			}
		})
	}
	return nil
}

func (h *hub) stop() {
	for _, s := range h.subs {
		_ = s.Unsubscribe()
	}
	for _, w := range h.watchers {
		_ = w.Stop()
	}
}

// loadRecent reads the newest alerts and missed or skipped fires.
func (h *hub) loadRecent(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, h.d.cfg.RequestTimeout)
	defer cancel()
	if info, err := jsInfo(rctx, h.d.js, protocol.StreamSupervisor); err == nil {
		msgs, _, _, _ := protocol.BackwardScan{Stream: protocol.StreamSupervisor, Filter: protocol.AlertLogSubjects,
			First: info.FirstSeq, Last: info.LastSeq, Want: ringSize, MaxScan: 2_000_000}.Run(rctx, h.nc)
		h.mu.Lock()
		for i := len(msgs) - 1; i >= 0; i-- {
			var a jetfleetpb.Alert
			if protocol.Unmarshal(msgs[i].Data, &a) == nil {
				h.alerts = append(h.alerts, &a)
			}
		}
		h.mu.Unlock()
	}
	if info, err := jsInfo(rctx, h.d.js, protocol.StreamEvents); err == nil {
		var all []protocol.StoredMsg
		for _, typ := range []string{protocol.EventMissed, protocol.EventSkipped} {
			msgs, _, _, _ := protocol.BackwardScan{Stream: protocol.StreamEvents, Filter: protocol.ScheduleEventSubject("*", typ),
				First: info.FirstSeq, Last: info.LastSeq, Want: ringSize, MaxScan: 2_000_000}.Run(rctx, h.nc)
			all = append(all, msgs...)
		}
		sort.Slice(all, func(i, j int) bool { return all[i].Sequence < all[j].Sequence })
		h.mu.Lock()
		for _, m := range all {
			var ev jetfleetpb.ScheduleEvent
			if protocol.Unmarshal(m.Data, &ev) == nil {
				h.fires = appendRing(h.fires, &ev)
			}
		}
		h.mu.Unlock()
	}
}

type streamState struct{ FirstSeq, LastSeq, Msgs uint64 }

func jsInfo(ctx context.Context, js jetstream.JetStream, name string) (streamState, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return streamState{}, err
	}
	info := s.CachedInfo()
	return streamState{info.State.FirstSeq, info.State.LastSeq, info.State.Msgs}, nil
}

func appendRing[T any](ring []T, v T) []T {
	ring = append(ring, v)
	if len(ring) > ringSize {
		ring = slices.Delete(ring, 0, len(ring)-ringSize)
	}
	return ring
}

// mark makes topics dirty: their browsers refresh at the next fan-out.
func (h *hub) mark(topics ...string) {
	h.mu.Lock()
	for _, t := range topics {
		h.dirty[t] = true
	}
	h.mu.Unlock()
}

func (h *hub) onEvent(m *nats.Msg) {
	subject, ok := protocol.ParseEventSubject(m.Subject)
	if !ok {
		h.onOtherEvent(m)
		return
	}
	switch subject.Of {
	case "job":
		var ev struct {
			JobID      string `json:"job_id"`
			ScheduleID string `json:"schedule_id"`
		}
		_ = json.Unmarshal(m.Data, &ev)
		topics := []string{"jobs", "kind:" + subject.Queue + "." + subject.Kind, "overview"}
		if ev.JobID != "" {
			topics = append(topics, "job:"+ev.JobID)
		}
		if ev.ScheduleID != "" {
			topics = append(topics, "schedule:"+ev.ScheduleID)
		}
		if run, ok := workflowRunOfJob(ev.JobID); ok {
			// The supervisor stores the run's new state after this event
			// (it reads events in batches, up to a second apart): the run's
			// pages refresh now and for a while after.
			topics = append(topics, "workflows", workflowTopic(run))
			h.follow(time.Now().Add(workflowFollow), "workflows", workflowTopic(run))
		}
		switch subject.Type {
		case protocol.EventSucceeded, protocol.EventDead, protocol.EventSkippedDuplicate:
			h.mu.Lock()
			r := h.out[subject.Queue]
			if r == nil {
				r = &rateRing{}
				h.out[subject.Queue] = r
			}
			r.add(time.Now())
			h.mu.Unlock()
			topics = append(topics, "running", "kinds")
			if subject.Type == protocol.EventDead {
				topics = append(topics, "dlq")
			}
		case protocol.EventStarted, protocol.EventProgress, protocol.EventWaiting, protocol.EventRescued, protocol.EventTimedOut, protocol.EventCancelled, protocol.EventFailed:
			topics = append(topics, "running")
		}
		h.mark(topics...)
	case "schedule":
		topics := []string{"schedules", "schedule:" + subject.ScheduleID}
		if subject.Type == protocol.EventMissed || subject.Type == protocol.EventSkipped {
			var ev jetfleetpb.ScheduleEvent
			if protocol.Unmarshal(m.Data, &ev) == nil {
				h.mu.Lock()
				h.fires = appendRing(h.fires, &ev)
				h.mu.Unlock()
			}
			topics = append(topics, "overview")
		}
		h.mark(topics...)
	case "queue":
		h.mark("overview")
	}
}

// onOtherEvent handles audit records and trend events.
func (h *hub) onOtherEvent(m *nats.Msg) {
	parts := strings.SplitN(m.Subject, ".", 4)
	if len(parts) < 3 {
		return
	}
	switch parts[1] {
	case "audit":
		var a protocol.Audit
		if json.Unmarshal(m.Data, &a) != nil {
			return
		}
		topics := []string{"dlq"}
		if run, ok := strings.CutPrefix(m.Subject, protocol.AuditWorkflowSubject("")); ok {
			topics = append(topics, "workflows", workflowTopic(run))
		}
		if a.JobID != "" {
			topics = append(topics, "job:"+a.JobID)
		}
		if a.ScheduleID != "" {
			topics = append(topics, "schedule:"+a.ScheduleID)
		}
		h.mark(topics...)
	case "trend":
		var ev jetfleet.TrendEvent
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		topics := []string{"overview", "kinds"}
		if ev.ScheduleID != "" {
			topics = append(topics, "schedule:"+ev.ScheduleID, "schedules")
		} else {
			topics = append(topics, "kind:"+ev.Queue+"."+ev.Kind)
		}
		h.mark(topics...)
	}
}

func (h *hub) onAlert(m *nats.Msg) {
	var a jetfleetpb.Alert
	if protocol.Unmarshal(m.Data, &a) != nil {
		return
	}
	h.mu.Lock()
	h.alerts = appendRing(h.alerts, &a)
	h.mu.Unlock()
	h.mark("overview")
	// A run's one alert (workflow_failed:<run>:<round>) is raised as it ends.
	if rest, ok := strings.CutPrefix(a.GetKey(), "workflow_failed:"); ok {
		if run, _, ok := strings.Cut(rest, ":"); ok {
			h.mark("workflows", workflowTopic(run))
		}
	}
}

func (h *hub) onSchedule(e jetstream.KeyValueEntry) {
	id := e.Key()
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(h.schedules, id)
	} else if s, err := jetfleet.DecodeSchedule(e.Value()); err == nil {
		if _, known := h.schedules[id]; !known {
			h.sorted = nil
		}
		h.schedules[id] = s
	}
	if _, ok := h.schedules[id]; !ok {
		h.sorted = nil
	}
	h.dirty["schedules"], h.dirty["schedule:"+id] = true, true
}

func (h *hub) onState(e jetstream.KeyValueEntry) {
	id := e.Key()
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(h.states, id)
	} else {
		var st jetfleet.ScheduleState
		if json.Unmarshal(e.Value(), &st) == nil {
			h.states[id] = &st
		}
	}
	h.dirty["schedules"], h.dirty["schedule:"+id] = true, true
}

// onAgent marks agent pages dirty when what they show changes: an agent
// appearing or leaving, its jobs or its draining flag (not every heartbeat).
func (h *hub) onAgent(e jetstream.KeyValueEntry) {
	id := e.Key()
	sig := "gone"
	if e.Operation() == jetstream.KeyValuePut {
		var hb jetfleetpb.Heartbeat
		if protocol.Unmarshal(e.Value(), &hb) != nil {
			return
		}
		var b strings.Builder
		b.WriteString(hb.GetStartedAt().String())
		if hb.GetDraining() {
			b.WriteString("/draining")
		}
		for _, j := range hb.GetJobs() {
			b.WriteString("/" + j.GetJobId())
		}
		sig = b.String()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.agentSig[id] == sig {
		return
	}
	h.agentSig[id] = sig
	h.dirty["agents"], h.dirty["overview"], h.dirty["running"] = true, true, true
}

// scheduleIDs returns the ids of the mirrored schedules, sorted.
func (h *hub) scheduleIDs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sorted == nil {
		h.sorted = make([]string, 0, len(h.schedules))
		for id := range h.schedules {
			h.sorted = append(h.sorted, id)
		}
		sort.Strings(h.sorted)
	}
	return h.sorted
}

func (h *hub) schedule(id string) (*jetfleet.Schedule, *jetfleet.ScheduleState) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.schedules[id], h.states[id]
}

func (h *hub) recentAlerts() []*jetfleetpb.Alert {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Clone(h.alerts)
	slices.Reverse(out)
	return out
}

func (h *hub) recentFires() []*jetfleetpb.ScheduleEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := slices.Clone(h.fires)
	slices.Reverse(out)
	return out
}

// subscribe registers a browser for topics; the returned func removes it.
func (h *hub) subscribe(topics []string) (*liveClient, func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.nclient >= h.d.cfg.MaxLiveClients {
		return nil, nil, errTooManyClients
	}
	c := &liveClient{notify: make(chan string, 1)}
	for _, t := range topics {
		if h.clients[t] == nil {
			h.clients[t] = map[*liveClient]bool{}
		}
		h.clients[t][c] = true
	}
	h.nclient++
	return c, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, t := range topics {
			delete(h.clients[t], c)
			if len(h.clients[t]) == 0 {
				delete(h.clients, t)
			}
		}
		h.nclient--
	}, nil
}

var errTooManyClients = errors.New("too many live clients")

// workflowFollow is how long a workflow run's pages refresh after one of
// its jobs' events: long enough for the supervisor to store the run's new
// state.
const workflowFollow = 5 * time.Second

// follow marks topics dirty every live_interval until until.
func (h *hub) follow(until time.Time, topics ...string) {
	h.mu.Lock()
	for _, t := range topics {
		h.followed[t] = until
	}
	h.mu.Unlock()
}

// fanOut tells the browsers of dirty topics to refresh.
func (h *hub) fanOut() {
	h.mu.Lock()
	if now := time.Now(); len(h.followed) > 0 && now.Sub(h.followedAt) >= h.d.cfg.LiveInterval {
		h.followedAt = now
		for t, until := range h.followed {
			if now.After(until) {
				delete(h.followed, t)
				continue
			}
			h.dirty[t] = true
		}
	}
	dirty := h.dirty
	h.dirty = map[string]bool{}
	for t := range dirty {
		for c := range h.clients[t] {
			select {
			case c.notify <- t:
			default: // a refresh is pending already
			}
		}
	}
	h.mu.Unlock()
}

// run fans out every quarter of live_interval and samples the fleet's
// status (queue backlogs, DLQ reasons) in the background.
func (h *hub) run(ctx context.Context) {
	fan := time.NewTicker(max(h.d.cfg.LiveInterval/4, 10*time.Millisecond))
	defer fan.Stop()
	sample := time.NewTicker(10 * time.Second)
	defer sample.Stop()
	h.sample(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-fan.C:
			h.fanOut()
		case <-sample.C:
			h.sample(ctx)
		}
	}
}

// sample records the queues' backlog (for the in-rate) and, when the DLQ
// changed, counts its letters by reason.
func (h *hub) sample(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, h.d.cfg.RequestTimeout)
	defer cancel()
	st, err := h.d.client.Status(rctx)
	if err != nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	h.status, h.statusAt = st, now
	for _, q := range st.Queues {
		s := append(h.backlog[q.Queue], backlogSample{at: now, jobs: q.Pending + uint64(q.AckPending)})
		for len(s) > 0 && now.Sub(s[0].at) > 3*time.Minute {
			s = s[1:]
		}
		h.backlog[q.Queue] = s
	}
	stale := h.dlqReason == nil || h.dlqDepth != st.DLQDepth || now.Sub(h.dlqAt) > time.Minute
	h.mu.Unlock()
	if stale {
		h.countDLQ(rctx, st.DLQDepth)
	}
}

// dlqScanLimit bounds the letters counted by reason.
const dlqScanLimit = 10_000

func (h *hub) countDLQ(ctx context.Context, depth uint64) {
	reasons := map[string]int{}
	var after uint64
	n := 0
	for n < dlqScanLimit {
		res, err := h.d.client.ListDeadLetters(ctx, jetfleet.DLQListRequest{After: after, Limit: 1000})
		if err != nil {
			return
		}
		for _, l := range res.Letters {
			reasons[l.Reason]++
		}
		n += len(res.Letters)
		if res.Next == 0 {
			break
		}
		after = res.Next
	}
	h.mu.Lock()
	h.dlqReason, h.dlqAt, h.dlqDepth = reasons, time.Now(), depth
	h.mu.Unlock()
}

// rates returns a queue's rate of finished runs (out) and of jobs entering
// it (in = out + the backlog's growth), per second over the last minute;
// ok is false until the dashboard has watched long enough.
func (h *hub) rates(queue string, now time.Time) (in, out float64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r := h.out[queue]; r != nil {
		out = r.perSecond(now, 60)
	}
	s := h.backlog[queue]
	if len(s) < 2 || now.Sub(h.started) < 30*time.Second {
		return 0, out, false
	}
	first, last := s[0], s[len(s)-1]
	for _, x := range s {
		if now.Sub(x.at) <= 70*time.Second {
			first = x
			break
		}
	}
	dt := last.at.Sub(first.at).Seconds()
	if dt < 5 {
		return 0, out, false
	}
	in = out + (float64(last.jobs)-float64(first.jobs))/dt
	return max(in, 0), out, true
}
