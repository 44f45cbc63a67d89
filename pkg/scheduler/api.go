package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// The request/reply API (protocol.APISchedule*), served by every replica
// as the micro service protocol.SchedulerService (discoverable with
// $SRV.INFO). Requests and replies are JSON (pkg/jetfleet holds their
// types); an error reply carries the micro error headers and an Error
// document (code, message, retryable, field).
const (
	// ServiceVersion is the API's version in $SRV.INFO.
	ServiceVersion = "0.2.0"

	// leaderSubject receives trigger and backfill requests forwarded by
	// replicas that do not lead; only the leader subscribes.
	leaderSubject = "jetfleet.scheduler.leader"
	// Operations forwarded on leaderSubject.<op>.
	opTrigger  = "trigger"
	opBackfill = "backfill"
)

func (s *Scheduler) serveAPI() (micro.Service, error) {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name: protocol.SchedulerService, Version: ServiceVersion,
		Description: "jetfleet schedules: add, update, get, ls, rm, pause, resume, trigger, preview, backfill",
		Metadata:    map[string]string{"holder": s.holder},
	})
	if err != nil {
		return nil, err
	}
	err = protocol.ServeAPI(svc, s.runner.Context, 2*s.cfg.PublishTimeout, map[string]protocol.APIHandlerFunc{
		protocol.APIScheduleAdd: s.apiAdd, protocol.APIScheduleUpdate: s.apiUpdate, protocol.APIScheduleGet: s.apiGet,
		protocol.APIScheduleList: s.apiList, protocol.APIScheduleRemove: s.apiRemove, protocol.APISchedulePause: s.apiPause,
		protocol.APIScheduleResume: s.apiResume, protocol.APISchedulePreview: s.apiPreview,
		protocol.APIScheduleTrigger: s.forwarding(opTrigger), protocol.APIScheduleBackfill: s.forwarding(opBackfill),
	})
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}

func unavailable(format string, args ...any) error {
	return protocol.Errorf(protocol.CodeUnavailable, format, args...)
}

func internal(err error) error { return protocol.AsAPIError(err) }

func notFound(id string) error {
	return &protocol.Error{Code: protocol.CodeNotFound, Field: "id", Message: fmt.Sprintf("no schedule %q", id)}
}

// prepare validates a definition for storing at now: the static checks of
// compile, then those that need the time or the server.
func (s *Scheduler) prepare(ctx context.Context, def *jetfleet.Schedule, now time.Time, triggerChanged bool) error {
	c, err := compile(def)
	if err != nil {
		return err
	}
	if triggerChanged {
		def.EffectiveFrom = now.UTC()
		if def.Spec.At != nil && !def.Spec.At.After(now) {
			// A one-shot in the past fires at once (catch-up policy applies).
			def.EffectiveFrom = def.Spec.At.Add(-time.Second).UTC()
		}
		if err := s.resolveStream(ctx, def); err != nil {
			return err
		}
	}
	if c.kind == kindTime {
		field, _ := def.Spec.TriggerField()
		if _, ok := c.nextNominal(max(now.Unix()-c.window, def.EffectiveFrom.Unix())); !ok {
			if c.end != math.MaxInt64 {
				field = "policy.end_at"
			}
			return protocol.FieldError(field, "leaves no time to fire at after %s", now.UTC().Format(time.RFC3339))
		}
		if def.Spec.At != nil && now.Unix()-def.Spec.At.Unix() > c.window {
			return protocol.FieldError("spec.at", "is further in the past than the catch-up window")
		}
	}
	if c.kind == kindEvent && c.overlap == overlapBufferOne || c.kind == kindDependency && c.overlap == overlapBufferOne {
		return protocol.FieldError("policy.overlap", "buffer_one needs a time trigger (an event cannot wait in the state)")
	}
	return nil
}

// resolveStream finds the stream of an event trigger and the sequence
// before which stream messages do not count.
func (s *Scheduler) resolveStream(ctx context.Context, def *jetfleet.Schedule) error {
	switch {
	case def.Spec.Event != nil:
		ev := def.Spec.Event
		if ev.Stream == "" {
			name, err := s.js.StreamNameBySubject(ctx, ev.Subject)
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return protocol.FieldError("spec.event.subject", "no stream captures %q: create one that does", ev.Subject)
			}
			if err != nil {
				return internal(err)
			}
			ev.Stream = name
		}
		seq, err := s.lastSequence(ctx, ev.Stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return protocol.FieldError("spec.event.stream", "no stream %q", ev.Stream)
		}
		if err != nil {
			return internal(err)
		}
		ev.StartSequence = seq
	case def.Spec.After != nil:
		seq, err := s.lastSequence(ctx, protocol.StreamEvents)
		if err != nil {
			return internal(err)
		}
		def.Spec.After.StartSequence = seq
	}
	return nil
}

func (s *Scheduler) lastSequence(ctx context.Context, stream string) (uint64, error) {
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

func (s *Scheduler) apiAdd(ctx context.Context, data []byte) (any, error) {
	def := &jetfleet.Schedule{}
	if err := protocol.DecodeRequest(data, def); err != nil {
		return nil, err
	}
	now := s.clk.Now()
	def.CreatedAt, def.UpdatedAt = now.UTC(), now.UTC()
	if err := s.prepare(ctx, def, now, true); err != nil {
		return nil, err
	}
	value, err := json.Marshal(def)
	if err != nil {
		return nil, internal(err)
	}
	// A state left by an earlier schedule of the same id (rm could not purge
	// it) does not carry over. Read it before the definition exists, so that
	// what is read cannot be the new schedule's own state.
	var leftover uint64
	if kve, err := s.states.Get(ctx, def.ID); err == nil {
		leftover = kve.Revision()
	}
	rev, err := s.defs.Create(ctx, def.ID, value)
	if errors.Is(err, jetstream.ErrKeyExists) {
		// The id is live: its state is not ours to touch.
		return nil, &protocol.Error{Code: protocol.CodeAlreadyExists, Field: "id", Message: fmt.Sprintf("schedule %q exists; use update", def.ID)}
	}
	if err != nil {
		return nil, internal(err)
	}
	if leftover != 0 {
		// Purge exactly the revision read: a state the leader wrote since
		// belongs to the new schedule and stays.
		err := s.states.Purge(ctx, def.ID, jetstream.LastRevision(leftover))
		if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			s.log.Warn("could not purge the state left by an earlier schedule of the same id",
				telemetry.LogScheduleID, def.ID, telemetry.LogError, err)
		}
	}
	s.publishEvent(ctx, def, "created", rev, "")
	return s.info(ctx, def, rev)
}

func (s *Scheduler) apiUpdate(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.ScheduleUpdateRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	def := &req.Schedule
	if err := protocol.ValidateToken("schedule id", def.ID); err != nil {
		return nil, protocol.FieldError("id", "%v", err)
	}
	cur, rev, err := s.load(ctx, def.ID)
	if err != nil {
		return nil, err
	}
	if req.Revision != 0 && req.Revision != rev {
		return nil, &protocol.Error{Code: protocol.CodeConflict, Field: "revision", Message: fmt.Sprintf("schedule %q is at revision %d, not %d", def.ID, rev, req.Revision)}
	}
	now := s.clk.Now()
	def.CreatedAt, def.UpdatedAt = cur.CreatedAt, now.UTC()
	def.Paused, def.Note = cur.Paused, cur.Note
	changed := triggerChanged(&cur.Spec, &def.Spec)
	if !changed {
		def.EffectiveFrom = cur.EffectiveFrom
		def.Spec = cur.Spec
	}
	if err := s.prepare(ctx, def, now, changed); err != nil {
		return nil, err
	}
	value, err := json.Marshal(def)
	if err != nil {
		return nil, internal(err)
	}
	newRev, err := s.defs.Update(ctx, def.ID, value, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil, &protocol.Error{Code: protocol.CodeConflict, Field: "revision", Message: fmt.Sprintf("schedule %q changed concurrently; read it again", def.ID)}
	}
	if err != nil {
		return nil, internal(err)
	}
	s.publishEvent(ctx, def, "updated", newRev, "")
	return s.info(ctx, def, newRev)
}

// triggerChanged compares the user-set parts of two specs.
func triggerChanged(a, b *jetfleet.Spec) bool {
	norm := func(sp *jetfleet.Spec) []byte {
		c := *sp
		if c.Event != nil {
			ev := *c.Event
			ev.StartSequence = 0
			if b.Event != nil && b.Event.Stream == "" {
				ev.Stream = ""
			}
			c.Event = &ev
		}
		if c.After != nil {
			dep := *c.After
			dep.StartSequence = 0
			c.After = &dep
		}
		data, _ := json.Marshal(c)
		return data
	}
	return !bytes.Equal(norm(a), norm(b))
}

func (s *Scheduler) load(ctx context.Context, id string) (*jetfleet.Schedule, uint64, error) {
	kve, err := s.defs.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, notFound(id)
	}
	if err != nil {
		return nil, 0, internal(err)
	}
	def, err := jetfleet.DecodeSchedule(kve.Value())
	if err != nil {
		return nil, 0, internal(err)
	}
	return def, kve.Revision(), nil
}

func (s *Scheduler) info(ctx context.Context, def *jetfleet.Schedule, rev uint64) (*jetfleet.ScheduleInfo, error) {
	info := &jetfleet.ScheduleInfo{Schedule: def, Revision: rev}
	rt := newRuntime()
	if kve, err := s.states.Get(ctx, def.ID); err == nil {
		var st jetfleet.ScheduleState
		if json.Unmarshal(kve.Value(), &st) == nil {
			info.State = &st
			rt = fromState(&st)
		}
	}
	c, err := compile(def)
	if err != nil || c.kind != kindTime || c.paused {
		return info, nil
	}
	t := max(rt.lastNominal, c.effectiveFrom)
	for range 3 {
		n, ok := c.nextNominal(t)
		if !ok {
			break
		}
		info.NextFires = append(info.NextFires, time.Unix(n, 0).In(c.loc))
		t = n
	}
	return info, nil
}

func (s *Scheduler) apiGet(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.ScheduleIDRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	def, rev, err := s.load(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return s.info(ctx, def, rev)
}

func (s *Scheduler) apiList(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.ScheduleListRequest
	if len(data) > 0 {
		if err := protocol.DecodeRequest(data, &req); err != nil {
			return nil, err
		}
	}
	limit := req.Limit
	switch {
	case limit < 0 || limit > 1000:
		return nil, protocol.FieldError("limit", "must be 1 to 1000")
	case limit == 0:
		limit = 100
	}
	// Read what this replica's mirror holds once it has caught up with the
	// bucket, so that a listing shows every write acknowledged before it.
	if err := s.syncDefinitions(ctx); err != nil {
		return nil, internal(err)
	}
	res := &jetfleet.ScheduleListResponse{Schedules: []jetfleet.ScheduleSummary{}}
	err := s.eng.call(ctx, func(e *engine) {
		ids := make([]string, 0, len(e.byID))
		for id, en := range e.byID {
			if en.c != nil && id > req.After {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		if len(ids) > limit {
			ids = ids[:limit]
			res.Next = ids[limit-1]
		}
		for _, id := range ids {
			res.Schedules = append(res.Schedules, e.summary(e.byID[id]))
		}
	})
	if err != nil {
		return nil, internal(err)
	}
	return res, nil
}

// syncDefinitions waits until the engine has every definition the bucket
// holds now.
func (s *Scheduler) syncDefinitions(ctx context.Context) error {
	st, err := s.defs.Status(ctx)
	if err != nil {
		return err
	}
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		// The watch hands a definition to the engine before it counts it
		// seen, so a call to the engine after this sees it.
		return s.defsSeen.wait(ctx, bs.StreamInfo().State.LastSeq)
	}
	return nil
}

func (e *engine) summary(en *entry) jetfleet.ScheduleSummary {
	c := en.c
	sum := jetfleet.ScheduleSummary{ID: en.id, Trigger: c.describe(), Queue: c.queue, Kind: c.kindName, Paused: c.paused, Running: en.rt.running}
	if en.rt.lastJobID != "" {
		t := time.Unix(en.rt.lastFireNom, 0).In(c.loc)
		sum.LastFire = &t
	}
	if c.kind == kindTime && !c.paused {
		if n, ok := c.nextNominal(max(en.rt.lastNominal, c.effectiveFrom)); ok {
			t := time.Unix(n, 0).In(c.loc)
			sum.NextFire = &t
		}
	}
	return sum
}

func (s *Scheduler) apiRemove(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.ScheduleIDRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	def, rev, err := s.load(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	if err := s.defs.Delete(ctx, req.ID, jetstream.LastRevision(rev)); err != nil {
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, &protocol.Error{Code: protocol.CodeConflict, Field: "id", Message: "the schedule changed concurrently; try again"}
		}
		return nil, internal(err)
	}
	if err := s.states.Purge(ctx, req.ID); err != nil {
		s.log.Warn("could not purge the state of a removed schedule", telemetry.LogScheduleID, req.ID, telemetry.LogError, err)
	}
	s.publishEvent(ctx, def, "deleted", rev+1, "")
	return struct{}{}, nil
}

func (s *Scheduler) apiPause(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.SchedulePauseRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	if len(req.Note) > maxTextLength {
		return nil, protocol.FieldError("note", "is longer than %d bytes", maxTextLength)
	}
	return s.modify(ctx, req.ID, "paused", req.Note, func(def *jetfleet.Schedule, _ time.Time) error {
		def.Paused, def.Note = true, req.Note
		return nil
	})
}

func (s *Scheduler) apiResume(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.ScheduleIDRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	return s.modify(ctx, req.ID, "resumed", "", func(def *jetfleet.Schedule, now time.Time) error {
		if !def.Paused {
			return nil
		}
		def.Paused, def.Note = false, ""
		// Nominal times that passed while paused are not caught up.
		if def.Spec.At == nil {
			def.EffectiveFrom = now.UTC()
		}
		return s.resolveStream(ctx, def)
	})
}

// modify applies change to a stored definition with a revision-checked
// write, reading again when another writer got there first.
func (s *Scheduler) modify(ctx context.Context, id, eventType, reason string, change func(*jetfleet.Schedule, time.Time) error) (any, error) {
	for attempt := 0; ; attempt++ {
		def, rev, err := s.load(ctx, id)
		if err != nil {
			return nil, err
		}
		now := s.clk.Now()
		if err := change(def, now); err != nil {
			return nil, err
		}
		def.UpdatedAt = now.UTC()
		value, err := json.Marshal(def)
		if err != nil {
			return nil, internal(err)
		}
		newRev, err := s.defs.Update(ctx, id, value, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && attempt < 5 {
			continue
		}
		if err != nil {
			return nil, internal(err)
		}
		s.publishEvent(ctx, def, eventType, newRev, reason)
		return s.info(ctx, def, newRev)
	}
}

func (s *Scheduler) publishEvent(ctx context.Context, def *jetfleet.Schedule, eventType string, rev uint64, reason string) {
	doc := &jetfleetpb.ScheduleEvent{Type: eventType, ScheduleId: def.ID, Time: timestamppb.New(s.clk.Now()),
		Queue: def.Target.Queue, Kind: def.Target.Kind, Reason: reason}
	data, err := protocol.Marshal(doc)
	if err != nil {
		return
	}
	msg := &nats.Msg{Subject: protocol.ScheduleEventSubject(def.ID, eventType), Data: data,
		Header: nats.Header{protocol.HeaderMsgID: {jobIDPrefix + def.ID + ".def." + strconv.FormatUint(rev, 10) + "." + eventType}}}
	if _, err := s.js.PublishMsg(ctx, msg); err != nil {
		s.log.Warn("schedule event not published", telemetry.LogScheduleID, def.ID, "type", eventType, telemetry.LogError, err)
	}
}

func (s *Scheduler) apiPreview(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.PreviewRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	def := req.Schedule
	switch {
	case req.ID != "" && def != nil:
		return nil, protocol.FieldError("id", "set id or schedule, not both")
	case req.ID != "":
		var err error
		if def, _, err = s.load(ctx, req.ID); err != nil {
			return nil, err
		}
	case def == nil:
		return nil, protocol.FieldError("id", "set id or schedule")
	}
	count := req.Count
	switch {
	case count < 0 || count > 1000:
		return nil, protocol.FieldError("count", "must be 1 to 1000")
	case count == 0:
		count = 10
	}
	c, err := compile(def)
	if err != nil {
		return nil, err
	}
	if c.kind != kindTime {
		return nil, protocol.FieldError("spec", "preview needs a cron, interval or one-shot trigger")
	}
	from := req.From
	if from.IsZero() {
		from = s.clk.Now()
	}
	res := &jetfleet.PreviewResponse{Zone: c.loc.String(), Times: []time.Time{}}
	t := from.Unix() - 1
	if from.Nanosecond() != 0 {
		t = from.Unix()
	}
	for range count {
		n, ok := c.nextNominal(t)
		if !ok {
			break
		}
		res.Times = append(res.Times, time.Unix(n, 0).In(c.loc))
		t = n
	}
	return res, nil
}

// forwarding runs a leader-only request here when this replica leads, and
// otherwise forwards it to the leader.
func (s *Scheduler) forwarding(op string) func(context.Context, []byte) (any, error) {
	return func(ctx context.Context, data []byte) (any, error) {
		res, err := s.leaderOp(ctx, op, data)
		if !errors.Is(err, errNotLeader) {
			return res, err
		}
		msg, err := s.nc.RequestWithContext(ctx, leaderSubject+"."+op, data)
		if errors.Is(err, nats.ErrNoResponders) {
			return nil, unavailable("no scheduler leader right now; try again")
		}
		if err != nil {
			return nil, internal(err)
		}
		return nil, &protocol.Forwarded{Reply: msg}
	}
}

// handleLeaderRequest serves requests forwarded by other replicas.
func (s *Scheduler) handleLeaderRequest(msg *nats.Msg) {
	op := msg.Subject[len(leaderSubject)+1:]
	ctx, cancel := context.WithTimeout(s.runner.Context(), 2*s.cfg.PublishTimeout)
	defer cancel()
	res, err := s.leaderOp(ctx, op, msg.Data)
	reply := nats.NewMsg(msg.Reply)
	if err != nil {
		doc := protocol.ToDoc(err)
		reply.Header.Set(micro.ErrorCodeHeader, protocol.HTTPStatus(doc.GetCode()))
		reply.Header.Set(micro.ErrorHeader, doc.GetMessage())
		reply.Data, _ = protocol.Marshal(doc)
	} else {
		reply.Data, _ = json.Marshal(res)
	}
	_ = msg.RespondMsg(reply)
}

func (s *Scheduler) leaderOp(ctx context.Context, op string, data []byte) (any, error) {
	switch op {
	case opTrigger:
		var req jetfleet.ScheduleIDRequest
		if err := protocol.DecodeRequest(data, &req); err != nil {
			return nil, err
		}
		return s.onEngine(ctx, func(e *engine) (any, error) { return e.trigger(req.ID) })
	case opBackfill:
		var req jetfleet.BackfillRequest
		if err := protocol.DecodeRequest(data, &req); err != nil {
			return nil, err
		}
		return s.onEngine(ctx, func(e *engine) (any, error) { return e.backfill(&req) })
	default:
		return nil, protocol.Errorf(protocol.CodeInvalidArgument, "unknown operation %q", op)
	}
}

// onEngine runs op in the engine. When op does not find its schedule, the
// request may have followed the schedule's add at once, before this
// replica's definition watch delivered it: op runs again once the engine
// holds every definition the bucket holds.
func (s *Scheduler) onEngine(ctx context.Context, op func(*engine) (any, error)) (any, error) {
	var (
		res any
		err error
	)
	for attempt := 0; ; attempt++ {
		if cerr := s.eng.call(ctx, func(e *engine) { res, err = op(e) }); cerr != nil {
			return nil, internal(cerr)
		}
		if attempt > 0 || !errors.Is(err, protocol.Code(protocol.CodeNotFound)) {
			return res, err
		}
		if serr := s.syncDefinitions(ctx); serr != nil {
			return res, err
		}
	}
}

func (e *engine) trigger(id string) (*jetfleet.TriggerResponse, error) {
	if !e.leading() {
		return nil, errNotLeader
	}
	en := e.byID[id]
	if en == nil || en.c == nil {
		return nil, notFound(id)
	}
	now := e.s.clk.Now()
	f := &fireReq{nominal: now.Unix(), planned: now.UnixNano(), jobID: jobIDPrefix + id + ".manual." + nuid.Next(), source: sourceTrigger}
	e.decide(en, e.work(en), f)
	e.flush()
	res := &jetfleet.TriggerResponse{JobID: f.jobID, NominalTime: time.Unix(f.nominal, 0).In(en.c.loc), Outcome: f.outcome, Reason: f.reason}
	if f.err != nil {
		return nil, internal(f.err)
	}
	if f.ack != nil {
		res.Duplicate = f.ack.Duplicate
	}
	return res, nil
}

func (e *engine) backfill(req *jetfleet.BackfillRequest) (*jetfleet.BackfillResponse, error) {
	if !e.leading() {
		return nil, errNotLeader
	}
	en := e.byID[req.ID]
	if en == nil || en.c == nil {
		return nil, notFound(req.ID)
	}
	c := en.c
	if c.kind != kindTime {
		return nil, protocol.FieldError("id", "backfill needs a schedule with a cron, interval or one-shot trigger")
	}
	now := e.s.clk.Now()
	switch {
	case req.From.IsZero():
		return nil, protocol.FieldError("from", "is required")
	case req.To.IsZero():
		return nil, protocol.FieldError("to", "is required")
	case req.To.After(now):
		return nil, protocol.FieldError("to", "is in the future")
	case req.From.After(req.To):
		return nil, protocol.FieldError("from", "is after to")
	case req.Max < 0:
		return nil, protocol.FieldError("max", "must not be negative")
	}
	limit := e.s.cfg.MaxBackfill
	if req.Max > 0 {
		limit = min(limit, req.Max)
	}
	res := &jetfleet.BackfillResponse{}
	var fires []*fireReq
	t := req.From.Unix() - 1
	if req.From.Nanosecond() != 0 {
		t = req.From.Unix()
	}
	for {
		n, ok := c.nextNominal(t)
		if !ok || n > req.To.Unix() {
			break
		}
		if len(fires) == limit {
			res.Truncated = true
			break
		}
		fires = append(fires, &fireReq{nominal: n, planned: c.plannedAt(n), jobID: jobID(en.id, n), source: sourceBackfill})
		t = n
	}
	w := e.work(en)
	for _, f := range fires {
		e.decide(en, w, f)
	}
	e.flush()
	for _, f := range fires {
		if f.err != nil {
			return nil, internal(f.err)
		}
		if f.outcome != "fired" {
			continue
		}
		res.Fired++
		if f.ack.Duplicate {
			res.Duplicates++
		}
		at := time.Unix(f.nominal, 0).In(c.loc)
		if res.First.IsZero() {
			res.First = at
		}
		res.Last = at
	}
	return res, nil
}
