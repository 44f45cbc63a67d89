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

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// The request/reply API, served by every replica as the micro service
// ServiceName (discoverable with $SRV.INFO) on APISubject + ".<endpoint>".
// Requests and replies are JSON; an error reply carries the micro error
// headers and an Error document (code, message, retryable, field).
const (
	ServiceName    = "jetfleet-scheduler"
	ServiceVersion = "0.1.0"
	APISubject     = "jetfleet.api.scheduler"

	// leaderSubject receives trigger and backfill requests forwarded by
	// replicas that do not lead; only the leader subscribes.
	leaderSubject = "jetfleet.scheduler.leader"
)

// API endpoints (the last token of their subject).
const (
	EndpointAdd      = "add"
	EndpointUpdate   = "update"
	EndpointGet      = "get"
	EndpointList     = "ls"
	EndpointRemove   = "rm"
	EndpointPause    = "pause"
	EndpointResume   = "resume"
	EndpointTrigger  = "trigger"
	EndpointPreview  = "preview"
	EndpointBackfill = "backfill"
)

// UpdateRequest replaces a schedule's description, spec, target and policy
// (pause state changes only through pause and resume). A non-zero Revision
// must match the stored one.
type UpdateRequest struct {
	Schedule
	Revision uint64 `json:"revision,omitempty"`
}

// IDRequest names a schedule (get, rm, resume, trigger).
type IDRequest struct {
	ID string `json:"id"`
}

// PauseRequest pauses a schedule with a note.
type PauseRequest struct {
	ID   string `json:"id"`
	Note string `json:"note,omitempty"`
}

// ListRequest pages through the schedules by id.
type ListRequest struct {
	// After is the last id of the previous page.
	After string `json:"after,omitempty"`
	// Limit defaults to 100; at most 1000.
	Limit int `json:"limit,omitempty"`
}

// ListResponse is one page of schedules; Next is the After of the next
// page, empty on the last one.
type ListResponse struct {
	Schedules []Summary `json:"schedules"`
	Next      string    `json:"next,omitempty"`
}

// Summary is a schedule in a listing.
type Summary struct {
	ID       string     `json:"id"`
	Trigger  string     `json:"trigger"`
	Queue    string     `json:"queue"`
	Kind     string     `json:"kind"`
	Paused   bool       `json:"paused,omitempty"`
	NextFire *time.Time `json:"next_fire,omitempty"`
	LastFire *time.Time `json:"last_fire,omitempty"`
	Running  string     `json:"running_job_id,omitempty"`
}

// Info is a schedule with its revision and state.
type Info struct {
	Schedule *Schedule `json:"schedule"`
	Revision uint64    `json:"revision"`
	State    *State    `json:"state,omitempty"`
	// NextFires are the next nominal times (up to 3) in the schedule's zone.
	NextFires []time.Time `json:"next_fires,omitempty"`
}

// TriggerResponse says what a trigger did: fired, skipped or buffered.
type TriggerResponse struct {
	JobID       string    `json:"job_id"`
	NominalTime time.Time `json:"nominal_time"`
	Outcome     string    `json:"outcome"`
	Reason      string    `json:"reason,omitempty"`
	Duplicate   bool      `json:"duplicate,omitempty"`
}

// PreviewRequest asks for the next Count nominal times at or after From
// (default now) of a stored schedule (ID) or of a definition not stored yet.
type PreviewRequest struct {
	ID       string    `json:"id,omitempty"`
	Schedule *Schedule `json:"schedule,omitempty"`
	From     time.Time `json:"from,omitzero"`
	// Count defaults to 10; at most 1000.
	Count int `json:"count,omitempty"`
}

// PreviewResponse lists nominal times in the schedule's zone.
type PreviewResponse struct {
	Zone  string      `json:"zone"`
	Times []time.Time `json:"times"`
}

// BackfillRequest fires every nominal time in [From, To] (To not in the
// future), oldest first, regardless of the overlap policy. Each fire has the
// job id of its nominal time, so times that already fired inside the JOBS
// duplicate window are not published again.
type BackfillRequest struct {
	ID   string    `json:"id"`
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Max bounds the fires; defaults to, and is capped by, scheduler.max_backfill.
	Max int `json:"max,omitempty"`
}

// BackfillResponse counts what a backfill published.
type BackfillResponse struct {
	Fired      int       `json:"fired"`
	Duplicates int       `json:"duplicates"`
	First      time.Time `json:"first,omitzero"`
	Last       time.Time `json:"last,omitzero"`
	// Truncated is true when nominal times after Last were left out (Max).
	Truncated bool `json:"truncated,omitempty"`
}

func (s *Scheduler) serveAPI() (micro.Service, error) {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name: ServiceName, Version: ServiceVersion,
		Description: "jetfleet schedules: add, update, get, ls, rm, pause, resume, trigger, preview, backfill",
		Metadata:    map[string]string{"holder": s.holder},
	})
	if err != nil {
		return nil, err
	}
	g := svc.AddGroup(APISubject)
	for name, h := range map[string]func(context.Context, []byte) (any, error){
		EndpointAdd: s.apiAdd, EndpointUpdate: s.apiUpdate, EndpointGet: s.apiGet, EndpointList: s.apiList,
		EndpointRemove: s.apiRemove, EndpointPause: s.apiPause, EndpointResume: s.apiResume,
		EndpointPreview: s.apiPreview,
		EndpointTrigger: s.forwarding(EndpointTrigger), EndpointBackfill: s.forwarding(EndpointBackfill),
	} {
		if err := g.AddEndpoint(name, s.handler(h)); err != nil {
			_ = svc.Stop()
			return nil, err
		}
	}
	return svc, nil
}

// errForwarded carries a reply from the leader back unchanged.
type errForwarded struct{ msg *nats.Msg }

func (e *errForwarded) Error() string { return "forwarded" }

func (s *Scheduler) handler(h func(context.Context, []byte) (any, error)) micro.HandlerFunc {
	return func(req micro.Request) {
		ctx, cancel := context.WithTimeout(s.runner.Context(), 2*s.cfg.PublishTimeout)
		defer cancel()
		res, err := h(ctx, req.Data())
		var fwd *errForwarded
		switch {
		case errors.As(err, &fwd):
			if code := fwd.msg.Header.Get(micro.ErrorCodeHeader); code != "" {
				_ = req.Error(code, fwd.msg.Header.Get(micro.ErrorHeader), fwd.msg.Data)
				return
			}
			_ = req.Respond(fwd.msg.Data)
		case err != nil:
			protocol.RespondError(req, err)
		default:
			data, merr := json.Marshal(res)
			if merr != nil {
				protocol.RespondError(req, merr)
				return
			}
			_ = req.Respond(data)
		}
	}
}

func unavailable(format string, args ...any) error {
	return protocol.Errorf(protocol.CodeUnavailable, format, args...)
}

func internal(err error) error {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) {
		return unavailable("%v", err)
	}
	return protocol.Errorf(protocol.CodeInternal, "%v", err)
}

func notFound(id string) error {
	return &protocol.Error{Code: protocol.CodeNotFound, Field: "id", Message: fmt.Sprintf("no schedule %q", id)}
}

// prepare validates a definition for storing at now: the static checks of
// compile, then those that need the time or the server.
func (s *Scheduler) prepare(ctx context.Context, def *Schedule, now time.Time, triggerChanged bool) error {
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
		field, _ := def.Spec.triggerField()
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
func (s *Scheduler) resolveStream(ctx context.Context, def *Schedule) error {
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
	def, err := DecodeSchedule(data)
	if err != nil {
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
	var req UpdateRequest
	if err := decodeJSON(data, &req); err != nil {
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
func triggerChanged(a, b *Spec) bool {
	norm := func(sp *Spec) []byte {
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

func (s *Scheduler) load(ctx context.Context, id string) (*Schedule, uint64, error) {
	kve, err := s.defs.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, notFound(id)
	}
	if err != nil {
		return nil, 0, internal(err)
	}
	def, err := DecodeSchedule(kve.Value())
	if err != nil {
		return nil, 0, internal(err)
	}
	return def, kve.Revision(), nil
}

func (s *Scheduler) info(ctx context.Context, def *Schedule, rev uint64) (*Info, error) {
	info := &Info{Schedule: def, Revision: rev}
	rt := newRuntime()
	if kve, err := s.states.Get(ctx, def.ID); err == nil {
		var st State
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
	var req IDRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	def, rev, err := s.load(ctx, req.ID)
	if err != nil {
		return nil, err
	}
	return s.info(ctx, def, rev)
}

func (s *Scheduler) apiList(ctx context.Context, data []byte) (any, error) {
	var req ListRequest
	if len(data) > 0 {
		if err := decodeJSON(data, &req); err != nil {
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
	res := &ListResponse{Schedules: []Summary{}}
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

func (e *engine) summary(en *entry) Summary {
	c := en.c
	sum := Summary{ID: en.id, Trigger: c.describe(), Queue: c.queue, Kind: c.kindName, Paused: c.paused, Running: en.rt.running}
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
	var req IDRequest
	if err := decodeJSON(data, &req); err != nil {
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
	var req PauseRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	if len(req.Note) > maxTextLength {
		return nil, protocol.FieldError("note", "is longer than %d bytes", maxTextLength)
	}
	return s.modify(ctx, req.ID, "paused", req.Note, func(def *Schedule, _ time.Time) error {
		def.Paused, def.Note = true, req.Note
		return nil
	})
}

func (s *Scheduler) apiResume(ctx context.Context, data []byte) (any, error) {
	var req IDRequest
	if err := decodeJSON(data, &req); err != nil {
		return nil, err
	}
	return s.modify(ctx, req.ID, "resumed", "", func(def *Schedule, now time.Time) error {
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
func (s *Scheduler) modify(ctx context.Context, id, eventType, reason string, change func(*Schedule, time.Time) error) (any, error) {
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

func (s *Scheduler) publishEvent(ctx context.Context, def *Schedule, eventType string, rev uint64, reason string) {
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
	var req PreviewRequest
	if err := decodeJSON(data, &req); err != nil {
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
	res := &PreviewResponse{Zone: c.loc.String(), Times: []time.Time{}}
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
		return nil, &errForwarded{msg: msg}
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
	case EndpointTrigger:
		var req IDRequest
		if err := decodeJSON(data, &req); err != nil {
			return nil, err
		}
		return s.onEngine(ctx, func(e *engine) (any, error) { return e.trigger(req.ID) })
	case EndpointBackfill:
		var req BackfillRequest
		if err := decodeJSON(data, &req); err != nil {
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

func (e *engine) trigger(id string) (*TriggerResponse, error) {
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
	res := &TriggerResponse{JobID: f.jobID, NominalTime: time.Unix(f.nominal, 0).In(en.c.loc), Outcome: f.outcome, Reason: f.reason}
	if f.err != nil {
		return nil, internal(f.err)
	}
	if f.ack != nil {
		res.Duplicate = f.ack.Duplicate
	}
	return res, nil
}

func (e *engine) backfill(req *BackfillRequest) (*BackfillResponse, error) {
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
	res := &BackfillResponse{}
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
