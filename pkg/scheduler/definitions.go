package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Reading and changing stored definitions for the API.

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
		return info, nil //nolint:nilerr // a definition that does not compile is listed without next fires
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
