package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Requests only the leader serves (trigger, backfill), forwarded to it by the
// other replicas.

const (
	// leaderSubject receives trigger and backfill requests forwarded by
	// replicas that do not lead; only the leader subscribes.
	leaderSubject = "jetfleet.scheduler.leader"
	// Operations forwarded on leaderSubject.<op>.
	opTrigger  = "trigger"
	opBackfill = "backfill"
)

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
