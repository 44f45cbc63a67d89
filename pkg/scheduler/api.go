package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// The request/reply API (protocol.APISchedule*), served by every replica
// as the micro service protocol.SchedulerService (discoverable with
// $SRV.INFO). Requests and replies are JSON (pkg/jetfleet holds their
// types); an error reply carries the micro error headers and an Error
// document (code, message, retryable, field).
// ServiceVersion is the API's version in $SRV.INFO.
const ServiceVersion = "0.2.0"

func (s *Scheduler) serveAPI() (micro.Service, error) {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name: protocol.SchedulerService, Version: ServiceVersion,
		Description: "jetfleet schedules: add, update, get, ls, rm, pause, resume, trigger, preview, backfill",
		Metadata:    map[string]string{"holder": s.rep.Holder()},
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
