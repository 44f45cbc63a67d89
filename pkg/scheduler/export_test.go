package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/lease"
)

// Kick makes the engine evaluate due schedules and publish at once, then
// returns: tests that move a fake clock call it instead of waiting for the
// engine's timer.
func (s *Scheduler) Kick(ctx context.Context) error {
	return s.eng.call(ctx, func(e *engine) { e.tick() })
}

// TickAfterLosingLease does, inside the engine, what a leader frozen past
// its lease deadline (SIGSTOP, a suspended VM) does when it resumes: the
// lease is no longer its own, the elector has not reported the step-down
// yet, resume runs (a test moves its fake clock past due fires there), and
// the engine's timer fires. Resign stands in for the deadline that passed
// while frozen.
func (s *Scheduler) TickAfterLosingLease(ctx context.Context, resume func()) error {
	return s.eng.call(ctx, func(e *engine) {
		s.rep.Resign()
		resume()
		e.tick()
	})
}

// WaitSynced waits until the replica's engine has applied everything the
// definition and state buckets hold now.
func (s *Scheduler) WaitSynced(ctx context.Context) error {
	if err := s.syncMirrors(ctx); err != nil {
		return err
	}
	return s.eng.call(ctx, func(*engine) {})
}

// StaleFireResult reports what a forced stale fire did.
type StaleFireResult struct {
	Published  bool
	Duplicate  bool
	Reloaded   bool
	StaleRev   uint64
	CurrentRev uint64
}

// ForceStaleFire makes a replica that does not lead act as a leader whose
// view of schedule id is stale: its state is rewound to before nominal and
// to revision staleRev, and the engine evaluates the schedule at the current
// time through the real fire path (publish with Nats-Msg-Id, then the
// revision-checked state write).
func (s *Scheduler) ForceStaleFire(ctx context.Context, id string, nominal int64, staleRev uint64) (*StaleFireResult, error) {
	res := &StaleFireResult{StaleRev: staleRev}
	var ferr error
	err := s.eng.call(ctx, func(e *engine) {
		en := e.byID[id]
		if en == nil || en.c == nil {
			ferr = errors.New("unknown schedule")
			return
		}
		e.forceLeader = true
		defer func() { e.forceLeader = false }()
		en.rt.lastNominal, en.stRev = nominal-1, staleRev
		if nominal-1 < en.c.effectiveFrom {
			en.rt.lastNominal = math.MinInt64
		}
		e.evaluate(en, s.clk.Now())
		fires := append([]*fireReq(nil), e.b.fires...)
		reload := false
		for _, t := range e.b.touched {
			if t == en {
				reload = true
			}
		}
		e.flush()
		for _, f := range fires {
			if f.en == en && f.nominal == nominal && f.ack != nil {
				res.Published, res.Duplicate = true, f.ack.Duplicate
			}
		}
		res.Reloaded = reload && en.stRev != staleRev
		res.CurrentRev = en.stRev
	})
	if err != nil {
		return nil, err
	}
	return res, ferr
}

// CheckRuns runs one pass of the leader's check of running runs (the loop
// runs it every LostRunGrace/2).
func (s *Scheduler) CheckRuns(ctx context.Context) error { return s.checkRuns(ctx) }

// RewindStateRevision makes the engine expect revision rev of schedule id's
// state, as a replica does whose watch missed the key's latest revision.
func (s *Scheduler) RewindStateRevision(ctx context.Context, id string, rev uint64) error {
	var ferr error
	err := s.eng.call(ctx, func(e *engine) {
		en := e.byID[id]
		if en == nil {
			ferr = errors.New("unknown schedule")
			return
		}
		en.stRev = rev
	})
	if err != nil {
		return err
	}
	return ferr
}

// RenewLeaseUnseen renews the leader lease the way a renewal whose reply was
// lost does: the leader's value, renewed now, is stored at the lease's
// current revision, and the elector does not learn the new revision. It
// returns that revision.
func (s *Scheduler) RenewLeaseUnseen(ctx context.Context) (uint64, error) {
	for {
		kve, err := s.leases.Get(ctx, s.cfg.LeaseKey)
		if err != nil {
			return 0, err
		}
		var v lease.Value
		if err := json.Unmarshal(kve.Value(), &v); err != nil {
			return 0, err
		}
		if v.Holder != s.rep.Holder() {
			return 0, errors.New("not holding the lease")
		}
		v.RenewedAt = time.Now().UTC()
		val, _ := json.Marshal(v)
		newRev, err := s.leases.Update(ctx, s.cfg.LeaseKey, val, kve.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) && ctx.Err() == nil {
			continue // the elector renewed meanwhile: use its revision
		}
		return newRev, err
	}
}
