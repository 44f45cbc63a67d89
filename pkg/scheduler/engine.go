package scheduler

import (
	"context"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// entry is one schedule as the engine knows it: its definition (nil until
// loaded), its state, and its place in the timer heap.
type entry struct {
	id      string
	c       *compiled
	defRev  uint64
	rt      schedState
	stRev   uint64
	heapIdx int32
	flags   entryFlags
	// conflicts counts the state writes in a row that met another
	// writer's revision; past the first, the schedule backs off.
	conflicts uint8
	due       int64 // Unix nanoseconds, while in the heap
	retryAt   int64 // Unix nanoseconds; 0 when no retry is pending
	// unresolved lists nominal times whose job was sent but whose publish
	// outcome is unknown (the answer was lost with a connection, or came
	// too late): JetStream may have stored it. They are fired again with
	// the same job id, however late — JetStream's duplicate check resolves
	// them — and never counted as missed.
	unresolved []int64
	// work is the batch's working copy of rt: decisions change it, and it
	// replaces rt once the revision-checked state write is acknowledged.
	work *schedState
}

type entryFlags uint8

const (
	flagFailed  entryFlags = 1 << iota // a fire of the batch failed: discard work
	flagDeleted                        // the definition was deleted during the batch
	flagReload                         // the state write hit another writer: reload
)

// Fire sources (metric attribute "source", event reason).
const (
	sourceSchedule   = "schedule"
	sourceCatchUp    = "catch_up"
	sourceEvent      = "event"
	sourceDependency = "dependency"
	sourceBuffered   = "buffered"
	sourceTrigger    = "trigger"
	sourceBackfill   = "backfill"
)

// fireReq is one job the batch publishes.
type fireReq struct {
	en      *entry
	nominal int64 // Unix seconds
	planned int64 // Unix nanoseconds: when the fire was due
	jobID   string
	source  string
	payload []byte // nil: the schedule's payload or template
	event   *EventData
	up      *UpstreamData
	note    string // reason written on the fired event

	// outcome of decide: empty when the fire was queued for publishing
	outcome string
	reason  string

	span    trace.Span
	traceID string
	sent    time.Time
	future  *pendingPub
	ack     *jetstream.PubAck
	err     error
}

// pendingEvent is a schedule event of the batch. It is published, and
// counted in the metrics, only once its schedule's state advance is stored:
// that revision-checked write is the fence of a leader that lost its lease
// without knowing it yet.
type pendingEvent struct {
	en      *entry
	subject string
	msgID   string
	doc     *jetfleetpb.ScheduleEvent
}

// batch collects what one pass of the engine decided, to publish together.
type batch struct {
	fires   []*fireReq
	events  []pendingEvent
	touched []*entry
}

// engine owns every schedule. One goroutine runs it; everything else talks
// to it through in.
type engine struct {
	s    *Scheduler
	ctx  context.Context
	in   chan func(*engine)
	byID map[string]*entry
	heap timerHeap
	b    batch
	due  []int64 // reused buffer of evaluate
	// stateRevs holds the state revision (the last sequence on the key's
	// subject, a delete or purge marker included) of ids that have no
	// entry: a removed schedule's purge marker, or a state marker that the
	// state watch delivered before the definition watch delivered the
	// definition. A new entry starts its revision-checked writes from it.
	stateRevs map[string]uint64

	defsLoaded, statesLoaded bool
	loaded                   int64 // entries with a definition

	leader       bool
	leaderGen    uint64
	leaderCtx    context.Context
	leaderCancel context.CancelFunc
	leaderSub    *nats.Subscription
	consumers    map[string]*streamConsumer
	// forceLeader lets a test drive the publish path of a replica that
	// believes, wrongly, that it leads (see export_test.go).
	forceLeader bool
}

// maxBatchEntries bounds the schedules one pass evaluates, so that inputs
// keep flowing while a large backlog drains.
const maxBatchEntries = 16384

// maxExpiredSteps bounds the nominal times counted one by one when a
// schedule comes back from a long outage; past it the cursor jumps to the
// catch-up window.
const maxExpiredSteps = 100_000

func newEngine(s *Scheduler) *engine {
	return &engine{s: s, in: make(chan func(*engine), 4096), byID: map[string]*entry{}, stateRevs: map[string]uint64{},
		consumers: map[string]*streamConsumer{}}
}

// send hands fn to the engine, or gives up when ctx ends.
func (e *engine) send(ctx context.Context, fn func(*engine)) bool {
	select {
	case e.in <- fn:
		return true
	case <-ctx.Done():
		return false
	}
}

// call runs fn in the engine and waits for it.
func (e *engine) call(ctx context.Context, fn func(*engine)) error {
	done := make(chan struct{})
	if !e.send(ctx, func(e *engine) { fn(e); close(done) }) {
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *engine) run(ctx context.Context) {
	e.ctx = ctx
	timer := e.s.clk.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.arm(timer)
		select {
		case <-ctx.Done():
			e.loseLeadership()
			return
		case fn := <-e.in:
			fn(e)
			e.drain()
		case <-timer.C():
		}
		e.tick()
	}
}

// tick evaluates the due schedules, if this replica leads, and publishes
// what the pass decided.
func (e *engine) tick() {
	if e.leading() {
		e.processDue()
	}
	e.flush()
}

// drain runs what else is waiting, so that work arriving together is
// published in one batch.
func (e *engine) drain() {
	for range 4096 {
		select {
		case fn := <-e.in:
			fn(e)
		default:
			return
		}
	}
}

// leading reports whether this replica may act as the leader now: it
// prepared its leadership and still holds the lease by its own deadline. The
// second check matters after a freeze (SIGSTOP, a long GC pause, a
// suspended VM): the lease may have passed to another replica before the
// elector could report the step-down. Every write of a leader is fenced by it.
func (e *engine) leading() bool {
	return e.forceLeader || (e.leader && e.s.rep.HoldsLease())
}

func (e *engine) arm(timer interface{ Reset(time.Duration) bool }) {
	// Not leading by the lease: the elector's step-down wakes the engine.
	if !e.leading() || e.heap.Len() == 0 {
		timer.Reset(time.Hour)
		return
	}
	d := time.Duration(e.heap.peek().due - e.s.clk.Now().UnixNano())
	timer.Reset(max(d, 0))
}

func (e *engine) entry(id string) *entry {
	en := e.byID[id]
	if en == nil {
		en = &entry{id: id, rt: newRuntime(), heapIdx: -1, stRev: e.stateRevs[id]}
		delete(e.stateRevs, id)
		e.byID[id] = en
	}
	return en
}

// noteStateRev remembers the state revision of an id without an entry.
func (e *engine) noteStateRev(id string, rev uint64) {
	if rev <= e.stateRevs[id] {
		return
	}
	if len(e.stateRevs) >= maxStateRevs {
		// Forgetting is safe: a write that expects an older revision
		// conflicts, and reload reads the marker's sequence.
		clear(e.stateRevs)
	}
	e.stateRevs[id] = rev
}

// maxStateRevs bounds the revisions kept for ids without an entry (removed
// schedules, mostly).
const maxStateRevs = 1 << 16

// work returns en's working copy for this batch.
func (e *engine) work(en *entry) *schedState {
	if en.work == nil {
		w := en.rt.clone()
		en.work = &w
		e.b.touched = append(e.b.touched, en)
	}
	return en.work
}

// applyDef takes a definition from the watch; c is nil when it was deleted.
func (e *engine) applyDef(id string, rev uint64, c *compiled) {
	en := e.byID[id]
	if c == nil {
		if en == nil {
			return
		}
		if en.c != nil {
			e.loaded--
		}
		e.heap.remove(en)
		en.flags |= flagDeleted
		delete(e.byID, id)
		// The state outlives the definition until the purge marker of rm
		// arrives; a schedule added again under the id writes after it.
		e.noteStateRev(id, en.stRev)
		e.stopConsumer(id)
		e.s.metrics.loaded.Store(e.loaded)
		return
	}
	en = e.entry(id)
	if rev <= en.defRev {
		return
	}
	if en.c == nil {
		e.loaded++
		e.s.metrics.loaded.Store(e.loaded)
	}
	en.c, en.defRev = c, rev
	e.syncConsumer(en)
	e.reschedule(en)
}

// applyState takes a state from the watch. Writes of this replica come back
// with a revision it already has and change nothing; a newer revision was
// written by another replica (a previous leader) and replaces ours.
func (e *engine) applyState(id string, rev uint64, rt *schedState) {
	en := e.byID[id]
	if en == nil {
		if rt == nil {
			// A delete or purge marker still moves the key's revision:
			// the next write under this id must expect it.
			e.noteStateRev(id, rev)
			return
		}
		en = e.entry(id)
	}
	if rev <= en.stRev {
		return
	}
	if rt == nil {
		en.rt = en.rt.afterMarker(en.c != nil)
	} else {
		en.rt = *rt
	}
	en.stRev = rev
	e.reschedule(en)
}

// reschedule puts en in the heap at its next due fire, or takes it out.
func (e *engine) reschedule(en *entry) {
	c := en.c
	if c == nil || c.kind != kindTime || c.paused {
		e.heap.remove(en)
		return
	}
	n, ok := c.nextNominal(max(en.rt.lastNominal, c.effectiveFrom))
	if !ok {
		if en.rt.done {
			e.heap.remove(en)
		} else {
			e.heap.set(en, 0) // nothing left: the leader records it as done
		}
		return
	}
	due := c.plannedAt(n)
	if en.retryAt > due {
		due = en.retryAt
	}
	e.heap.set(en, due)
}

// processDue evaluates every schedule whose fire is due.
func (e *engine) processDue() {
	now := e.s.clk.Now()
	nowNs := now.UnixNano()
	for n := 0; e.heap.Len() > 0 && e.heap.peek().due <= nowNs && n < maxBatchEntries; n++ {
		en := e.heap.pop()
		en.retryAt = 0
		e.evaluate(en, now)
	}
}

// evaluate decides what to do with the due nominal times of a time
// trigger: fire, skip (overlap) or miss (downtime), per policy.
func (e *engine) evaluate(en *entry, now time.Time) {
	c := en.c
	if c == nil || c.kind != kindTime || c.paused {
		return
	}
	nowNs, nowSec := now.UnixNano(), now.Unix()
	threshold := int64(e.s.cfg.MisfireThreshold)
	window := c.window * int64(time.Second)
	base := &en.rt
	if en.work != nil {
		base = en.work
	}
	cursor := max(base.lastNominal, c.effectiveFrom)
	due := e.due[:0]
	var expired, lastExpired int64
	t, exhausted, steps := cursor, false, 0
	for {
		n, ok := c.nextNominal(t)
		if !ok {
			exhausted = true
			break
		}
		p := c.plannedAt(n)
		if p > nowNs {
			break
		}
		t = n
		if nowNs-p > window {
			expired, lastExpired = expired+1, n
			if steps++; steps >= maxExpiredSteps {
				// A long outage: jump to the start of the catch-up window.
				jump := nowSec - c.window - c.jitter/int64(time.Second) - 1
				if jump > t {
					t = jump
				}
				steps = 0
			}
			continue
		}
		due = append(due, n)
	}
	e.due = due
	if len(due) == 0 && expired == 0 && exhausted == base.done {
		e.reschedule(en) // woken early (a retry or a spurious timer)
		return
	}
	w := e.work(en)
	w.lastNominal = max(w.lastNominal, t)
	w.done = exhausted

	var misfired, onTime []int64
	for _, n := range due {
		if nowNs-c.plannedAt(n) > threshold && !slices.Contains(en.unresolved, n) {
			misfired = append(misfired, n)
		} else {
			onTime = append(onTime, n)
		}
	}
	if expired > 0 {
		e.miss(en, w, lastExpired, expired, "outside_catch_up_window")
	}
	var fire []int64
	switch c.misfire {
	case misfireFireAll:
		if extra := len(misfired) - int(c.maxCatchUp); extra > 0 {
			e.miss(en, w, misfired[extra-1], int64(extra), "max_catch_up")
			misfired = misfired[extra:]
		}
		fire = append(append(fire, misfired...), onTime...)
		slices.Sort(fire)
	case misfireFireOnce:
		if len(onTime) > 0 {
			if len(misfired) > 0 {
				e.miss(en, w, misfired[len(misfired)-1], int64(len(misfired)), "misfire_fire_once")
			}
			fire = onTime
		} else if len(misfired) > 0 {
			if len(misfired) > 1 {
				e.miss(en, w, misfired[len(misfired)-2], int64(len(misfired)-1), "misfire_fire_once")
			}
			fire = misfired[len(misfired)-1:]
		}
	case misfireSkip:
		if len(misfired) > 0 {
			e.miss(en, w, misfired[len(misfired)-1], int64(len(misfired)), "misfire_skip")
		}
		fire = onTime
	}
	for _, n := range fire {
		source := sourceSchedule
		if nowNs-c.plannedAt(n) > threshold {
			source = sourceCatchUp
		}
		e.decide(en, w, &fireReq{nominal: n, planned: c.plannedAt(n), jobID: jobID(en.id, n), source: source})
	}
}

// decide applies the overlap policy to one fire and queues it.
func (e *engine) decide(en *entry, w *schedState, f *fireReq) {
	c := en.c
	tracked := c.overlap != overlapAllow && f.source != sourceBackfill
	if tracked && w.running != "" {
		switch c.overlap {
		case overlapSkip:
			e.skip(en, w, f, "overlap")
			return
		case overlapBufferOne:
			if w.buffered == 0 && f.event == nil {
				w.buffered = f.nominal
				f.outcome, f.reason = "buffered", "overlap"
				return
			}
			e.skip(en, w, f, "overlap_buffer_full")
			return
		case overlapCancelPrevious:
			e.s.cancelRun(run{jobID: w.running, seq: w.runningSeq, queue: c.queue, kind: c.kindName}, f.jobID)
			f.note = "cancel_previous " + w.running
		}
	}
	if f.payload == nil {
		switch {
		case c.tmpl != nil:
			data := &TemplateData{ScheduleID: en.id, JobID: f.jobID, NominalTime: time.Unix(f.nominal, 0).In(c.loc),
				FireTime: time.Unix(0, f.planned).In(c.loc), Event: f.event, Upstream: f.up}
			body, err := render(c.tmpl, data)
			if err != nil {
				e.skip(en, w, f, "payload_template: "+err.Error())
				return
			}
			f.payload = body
		case c.payload != nil:
			f.payload = c.payload
		case f.event != nil:
			f.payload = []byte(f.event.Data)
		}
	}
	if tracked {
		w.running, w.runningSeq = f.jobID, 0
	}
	f.en = en
	e.b.fires = append(e.b.fires, f)
}

func (e *engine) skip(en *entry, w *schedState, f *fireReq, reason string) {
	w.skips++
	f.outcome, f.reason = "skipped", reason
	e.event(en, &jetfleetpb.ScheduleEvent{Type: "skipped", NominalTime: ts(f.nominal), JobId: f.jobID, Reason: reason},
		f.jobID+".skipped")
}

func (e *engine) miss(en *entry, w *schedState, last, count int64, reason string) {
	w.misses += uint64(count)
	e.event(en, &jetfleetpb.ScheduleEvent{Type: "missed", NominalTime: ts(last), Count: uint32(min(count, math.MaxUint32)), Reason: reason},
		jobID(en.id, last)+".missed")
}
