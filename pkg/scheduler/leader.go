package scheduler

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// streamConsumer is the ordered consumer feeding one event or dependency
// schedule while this replica leads.
type streamConsumer struct {
	cancel  context.CancelFunc
	stream  string
	filters []string
}

// onLeadership reacts to the elector. Gaining leadership starts a
// preparation in the background (catch up with the state bucket, start
// watching run completions, check runs inherited from the previous leader);
// only then does the engine start firing.
func (e *engine) onLeadership(leading bool) {
	e.s.metrics.leaderChanges.Add(e.ctx, 1)
	if !leading {
		e.loseLeadership()
		return
	}
	e.loseLeadership()
	e.leaderGen++
	gen := e.leaderGen
	e.leaderCtx, e.leaderCancel = context.WithCancel(e.ctx)
	lctx := e.leaderCtx
	e.s.runner.Go(func(context.Context) { e.s.prepareLeadership(lctx, gen) })
}

func (e *engine) loseLeadership() {
	if e.leaderCancel != nil {
		e.leaderCancel()
		e.leaderCancel = nil
	}
	if e.leaderSub != nil {
		_ = e.leaderSub.Unsubscribe()
		e.leaderSub = nil
	}
	clear(e.consumers)
	if e.leader {
		e.leader = false
		e.s.metrics.leading.Store(0)
		e.s.rep.SetLeading(false)
	}
}

// becomeLeader runs in the engine once preparation finished.
func (e *engine) becomeLeader(gen uint64, finished, lost []run) {
	if gen != e.leaderGen || e.leaderCtx == nil || e.leaderCtx.Err() != nil {
		return
	}
	e.leader = true
	e.s.metrics.leading.Store(1)
	e.s.rep.SetLeading(true)
	for _, r := range finished {
		e.complete(r.jobID, r.seq)
	}
	for _, r := range lost {
		e.abandonRun(r.jobID, r.seq)
	}
	sub, err := e.s.nc.Subscribe(leaderSubject+".*", e.s.handleLeaderRequest)
	if err != nil {
		e.s.log.Error("cannot serve forwarded requests", telemetry.LogError, err)
	}
	e.leaderSub = sub
	for _, en := range e.byID {
		if en.c != nil && en.c.kind != kindTime {
			e.syncConsumer(en)
		}
	}
}

func (s *Scheduler) prepareLeadership(ctx context.Context, gen uint64) {
	// 1. Catch up with what the previous leader wrote.
	if err := s.syncMirrors(ctx); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("leader starts before its state mirror caught up", telemetry.LogError, err)
		}
	}
	// 2. Watch completions from now on, before checking older runs. Its
	// consumer is created through the cluster's meta leader, which has to
	// be elected again when its node was just lost (the node this replica
	// left, often): then fire without the watch after completionWatchWait,
	// and let it start when it can. Runs that end before it does are found
	// by watchRuns.
	started := make(chan error, 1)
	since := s.realClk.Now().Add(-completionReplay)
	s.runner.Go(func(context.Context) { s.consumeCompletions(ctx, since, started) })
	wait := s.realClk.NewTimer(completionWatchWait)
	select {
	case err := <-started:
		if err != nil {
			s.log.Warn("cannot watch job completions yet; trying again, and the run check finds runs that end meanwhile", telemetry.LogError, err)
		}
	case <-wait.C():
		s.log.Warn("job completions not watched yet; leading without waiting for the watch, and the run check finds runs that end meanwhile",
			"waited", completionWatchWait.String())
	case <-ctx.Done():
		wait.Stop()
		return
	}
	wait.Stop()
	// 3. Runs started under the previous leader may be over already.
	var running []run
	if err := s.eng.call(ctx, func(e *engine) { running = e.runningRuns() }); err != nil {
		return
	}
	s.gone.reset()
	finished, lost := s.settleRuns(ctx, running)
	if !s.eng.send(ctx, func(e *engine) { e.becomeLeader(gen, finished, lost) }) {
		return
	}
	// 4. While leading, look for runs that ended unseen (docs/scheduling.md §1.3).
	s.watchRuns(ctx)
}

// syncMirrors waits until the watches have delivered everything the
// definition and state buckets held when it was called.
func (s *Scheduler) syncMirrors(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.leaseTTL)
	defer cancel()
	for _, m := range []struct {
		kv   jetstream.KeyValue
		seen *seqWaiter
	}{{s.defs, &s.defsSeen}, {s.states, &s.statesSeen}} {
		st, err := m.kv.Status(ctx)
		if err != nil {
			return err
		}
		bs, ok := st.(*jetstream.KeyValueBucketStatus)
		if !ok {
			continue
		}
		if err := m.seen.wait(ctx, bs.StreamInfo().State.LastSeq); err != nil {
			return err
		}
	}
	return nil
}

// completionWatchWait is how long a new leader waits for its watch of job
// completions before it leads without it (prepareLeadership).
const completionWatchWait = time.Second

// completionReplay is how far before the leader's preparation its watch of
// job completions starts reading: the server stamps the events, and its
// clock may be a little behind this host's.
const completionReplay = 2 * time.Second

// consumeCompletions feeds the job events that end a run (succeeded,
// skipped_duplicate, dead) of scheduled jobs, stored since since, to the
// engine until ctx ends. A watch that starts late (the meta leader was
// electing) so misses no run that ended before it started; reading an end
// twice is harmless (engine.complete). It sends the outcome of its first
// attempt to start the watch on started, and tries again every retry_delay
// until one succeeds.
func (s *Scheduler) consumeCompletions(ctx context.Context, since time.Time, started chan<- error) {
	filters := make([]string, len(protocol.RunEndEvents))
	for i, typ := range protocol.RunEndEvents {
		filters[i] = protocol.JobEventsOfType("*", "*", typ)
	}
	var cc jetstream.ConsumeContext
	for attempt := 0; ; attempt++ {
		cons, err := s.js.OrderedConsumer(ctx, protocol.StreamEvents, jetstream.OrderedConsumerConfig{
			FilterSubjects: filters,
			DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
			OptStartTime:   &since,
		})
		if err == nil {
			cc, err = cons.Consume(func(msg jetstream.Msg) {
				ref := jobRefOfEvent(msg.Data())
				if !strings.HasPrefix(ref.JobID, jobIDPrefix) {
					return
				}
				s.eng.send(ctx, func(e *engine) { e.complete(ref.JobID, uint64(ref.StreamSequence)) })
			})
		}
		if attempt == 0 {
			started <- err
		}
		if err == nil {
			if attempt > 0 {
				s.log.Info("watching job completions", "attempts", attempt+1)
			}
			break
		}
		retry := s.realClk.NewTimer(s.cfg.RetryDelay)
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case <-retry.C():
		}
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
}

const jobIDPrefix = "sched."

// scheduleOfJob returns the schedule id of a job id the scheduler made:
// sched.<schedule id>.<suffix>.
func scheduleOfJob(jobID string) (string, bool) {
	rest, ok := strings.CutPrefix(jobID, jobIDPrefix)
	if !ok {
		return "", false
	}
	id, _, ok := strings.Cut(rest, ".")
	return id, ok && id != ""
}

// nominalOfJob returns the nominal time of a timer job id sched.<id>.<unix>.
func nominalOfJob(jobID string) (int64, bool) {
	i := strings.LastIndexByte(jobID, '.')
	if i < 0 || !strings.HasPrefix(jobID, jobIDPrefix) {
		return 0, false
	}
	n, err := strconv.ParseInt(jobID[i+1:], 10, 64)
	return n, err == nil
}

// eventRef is what the scheduler reads of a job event on its hot path: the
// job and the JOBS message it is about. Proto3 JSON writes 64-bit integers
// as strings, and readers accept numbers too (docs/protocol.md §5).
type eventRef struct {
	JobID          string
	StreamSequence jsonUint64
}

func jobRefOfEvent(data []byte) eventRef {
	var ev struct {
		JobID          string     `json:"job_id"`
		JobIDCamel     string     `json:"jobId"`
		StreamSeq      jsonUint64 `json:"stream_sequence"`
		StreamSeqCamel jsonUint64 `json:"streamSequence"`
	}
	if json.Unmarshal(data, &ev) != nil {
		return eventRef{}
	}
	ref := eventRef{JobID: ev.JobID, StreamSequence: ev.StreamSeq}
	if ref.JobID == "" {
		ref.JobID = ev.JobIDCamel
	}
	if ref.StreamSequence == 0 {
		ref.StreamSequence = ev.StreamSeqCamel
	}
	return ref
}

// jsonUint64 reads a JSON number or a string of digits; anything else is 0.
type jsonUint64 uint64

func (u *jsonUint64) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseUint(strings.Trim(string(b), `"`), 10, 64)
	if err == nil {
		*u = jsonUint64(n)
	}
	return nil
}

// syncConsumer starts, restarts or stops en's stream consumer to match its
// definition and this replica's leadership.
func (e *engine) syncConsumer(en *entry) {
	c := en.c
	want := e.leader && c != nil && !c.paused && c.kind != kindTime && c.stream != ""
	have := e.consumers[en.id]
	if have != nil && (!want || have.stream != c.stream || !equalStrings(have.filters, c.filters)) {
		e.stopConsumer(en.id)
		have = nil
	}
	if want && have == nil {
		e.startConsumer(en)
	}
}

func (e *engine) restartConsumer(en *entry) {
	if e.consumers[en.id] != nil {
		e.stopConsumer(en.id)
		e.syncConsumer(en)
	}
}

func (e *engine) stopConsumer(id string) {
	if sc := e.consumers[id]; sc != nil {
		sc.cancel()
		delete(e.consumers, id)
	}
}

func (e *engine) startConsumer(en *entry) {
	c := en.c
	start := max(en.rt.eventSeq, c.startSeq) + 1
	ctx, cancel := context.WithCancel(e.leaderCtx)
	sc := &streamConsumer{cancel: cancel, stream: c.stream, filters: c.filters}
	e.consumers[en.id] = sc
	id := en.id
	e.s.runner.Go(func(context.Context) { e.s.consumeStream(ctx, id, sc, start) })
}

// streamMsg is a message of an event or dependency trigger.
type streamMsg struct {
	seq     uint64
	subject string
	time    time.Time
	header  map[string][]string
	data    []byte
}

// consumeStream feeds the messages of one stream-triggered schedule to the
// engine, from sequence start, until ctx ends. It recreates its consumer
// after failures.
func (s *Scheduler) consumeStream(ctx context.Context, id string, sc *streamConsumer, start uint64) {
	retry := s.realClk.NewTimer(0)
	defer retry.Stop()
	next := start
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C():
		}
		cons, err := s.js.OrderedConsumer(ctx, sc.stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: sc.filters, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: next,
		})
		var cc jetstream.ConsumeContext
		if err == nil {
			cc, err = cons.Consume(func(msg jetstream.Msg) {
				meta, err := msg.Metadata()
				if err != nil {
					return
				}
				m := &streamMsg{seq: meta.Sequence.Stream, subject: msg.Subject(), time: meta.Timestamp,
					header: msg.Headers(), data: msg.Data()}
				next = m.seq + 1
				s.eng.send(ctx, func(e *engine) {
					if e.consumers[id] == sc {
						e.onStream(id, m)
					}
				})
			})
		}
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("cannot consume the trigger stream; retrying", telemetry.LogScheduleID, id, "stream", sc.stream, telemetry.LogError, err)
				retry.Reset(s.cfg.RetryDelay)
			}
			continue
		}
		<-ctx.Done()
		cc.Stop()
		<-cc.Closed()
		return
	}
}

// onStream handles one message of an event or dependency trigger.
func (e *engine) onStream(id string, m *streamMsg) {
	en := e.byID[id]
	if en == nil || en.c == nil {
		return
	}
	c := en.c
	base := en.rt.eventSeq
	if en.work != nil {
		base = en.work.eventSeq
	}
	if m.seq <= max(base, c.startSeq) {
		return // seen already
	}
	w := e.work(en)
	w.eventSeq = m.seq
	at := m.time.Unix()
	if at < c.start || at > c.end {
		return
	}
	switch c.kind {
	case kindEvent:
		ev := &EventData{Subject: m.subject, Sequence: m.seq, Time: m.time, Header: m.header, Data: string(m.data)}
		var parsed any
		if json.Unmarshal(m.data, &parsed) == nil {
			ev.JSON = parsed
		}
		e.decide(en, w, &fireReq{nominal: at, planned: m.time.UnixNano(), jobID: eventJobID(id, m.seq), source: sourceEvent, event: ev})
	case kindDependency:
		e.onJobEvent(en, w, m)
	}
}

func eventJobID(id string, seq uint64) string {
	return jobIDPrefix + id + ".e" + strconv.FormatUint(seq, 10)
}

func (e *engine) onJobEvent(en *entry, w *schedState, m *streamMsg) {
	c := en.c
	var ev jetfleetpb.JobEvent
	if err := protocol.Unmarshal(m.data, &ev); err != nil {
		return
	}
	subject, ok := protocol.ParseEventSubject(m.subject)
	if !ok || subject.Of != "job" {
		return
	}
	queue, kind := subject.Queue, subject.Kind
	upSched := ev.GetScheduleId()
	if upSched == "" {
		upSched, _ = scheduleOfJob(ev.GetJobId())
	}
	var nominal int64
	hasNominal := false
	if ev.GetNominalTime() != nil {
		nominal, hasNominal = ev.GetNominalTime().AsTime().Unix(), true
	} else if n, ok := nominalOfJob(ev.GetJobId()); ok {
		nominal, hasNominal = n, true
	}
	var matched uint32
	for i, u := range c.upstreams {
		if u.ScheduleID != "" && u.ScheduleID == upSched ||
			u.ScheduleID == "" && u.Kind == kind && (u.Queue == "" || u.Queue == queue) {
			matched |= 1 << i
		}
	}
	if matched == 0 {
		return
	}
	up := &UpstreamData{JobID: ev.GetJobId(), Queue: queue, Kind: kind, ScheduleID: upSched}
	if hasNominal {
		up.NominalTime = time.Unix(nominal, 0).In(c.loc)
	}
	planned := m.time.UnixNano()
	if len(c.upstreams) == 1 {
		if !hasNominal {
			e.decide(en, w, &fireReq{nominal: m.time.Unix(), planned: planned, jobID: eventJobID(en.id, m.seq), source: sourceDependency, up: up})
			return
		}
		e.decide(en, w, &fireReq{nominal: nominal, planned: planned, jobID: jobID(en.id, nominal), source: sourceDependency, up: up})
		return
	}
	if !hasNominal {
		return // only scheduled runs take part in a fan-in
	}
	for _, k := range sortedKeys(w.pending) {
		if m.time.Unix()-k > c.depWindow && k != nominal {
			delete(w.pending, k)
			e.skip(en, w, &fireReq{nominal: k, jobID: jobID(en.id, k)}, "dependency_incomplete")
		}
	}
	if w.pending == nil {
		w.pending = map[int64]uint32{}
	}
	all := uint32(1)<<len(c.upstreams) - 1
	w.pending[nominal] |= matched
	if w.pending[nominal] != all {
		return
	}
	delete(w.pending, nominal)
	e.decide(en, w, &fireReq{nominal: nominal, planned: planned, jobID: jobID(en.id, nominal), source: sourceDependency, up: up})
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
