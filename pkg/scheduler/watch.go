package scheduler

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// seqWaiter records the highest bucket revision a watch delivered and lets
// callers wait for one.
type seqWaiter struct {
	mu   sync.Mutex
	seen uint64
	ch   chan struct{}
}

func (w *seqWaiter) update(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq <= w.seen {
		return
	}
	w.seen = seq
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

func (w *seqWaiter) wait(ctx context.Context, seq uint64) error {
	for {
		w.mu.Lock()
		if w.seen >= seq {
			w.mu.Unlock()
			return nil
		}
		if w.ch == nil {
			w.ch = make(chan struct{})
		}
		ch := w.ch
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watchDefinitions mirrors bucket schedules into the engine: every replica
// keeps every definition compiled, so a new leader starts at once.
func (s *Scheduler) watchDefinitions(ctx context.Context) {
	s.watch(ctx, s.defs, &s.defsSeen, func(kve jetstream.KeyValueEntry) func(*engine) {
		id, rev := kve.Key(), kve.Revision()
		if kve.Operation() != jetstream.KeyValuePut {
			return func(e *engine) { e.applyDef(id, rev, nil) }
		}
		def, err := jetfleet.DecodeSchedule(kve.Value())
		var c *compiled
		if err == nil {
			c, err = compile(def)
		}
		if err != nil {
			s.log.Error("ignoring an invalid schedule definition", telemetry.LogScheduleID, id, telemetry.LogError, err)
			return func(e *engine) { e.applyDef(id, rev, nil) }
		}
		return func(e *engine) { e.applyDef(id, rev, c) }
	}, func(e *engine) { e.defsLoaded = true })
}

// watchStates mirrors bucket schedule_state into the engine.
func (s *Scheduler) watchStates(ctx context.Context) {
	s.watch(ctx, s.states, &s.statesSeen, func(kve jetstream.KeyValueEntry) func(*engine) {
		id, rev := kve.Key(), kve.Revision()
		if kve.Operation() != jetstream.KeyValuePut {
			return func(e *engine) { e.applyState(id, rev, nil) }
		}
		rt, err := decodeState(kve.Value())
		if err != nil {
			s.log.Error("ignoring an unreadable schedule state", telemetry.LogScheduleID, id, telemetry.LogError, err)
			return nil
		}
		return func(e *engine) { e.applyState(id, rev, &rt) }
	}, func(e *engine) { e.statesLoaded = true })
}

// watch runs a bucket watch until ctx ends, restarting it after failures.
// Decoding happens here, outside the engine.
func (s *Scheduler) watch(ctx context.Context, kv jetstream.KeyValue, seen *seqWaiter,
	decode func(jetstream.KeyValueEntry) func(*engine), loaded func(*engine)) {
	retry := s.realClk.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C():
		}
		var w jetstream.KeyWatcher
		var err error
		if from := seen.current(); from == 0 {
			w, err = kv.WatchAll(ctx)
		} else {
			// A restarted watch resumes where the last one stopped.
			w, err = kv.WatchAll(ctx, jetstream.IncludeHistory(), jetstream.ResumeFromRevision(from+1))
		}
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("bucket watch failed; retrying", "bucket", kv.Bucket(), telemetry.LogError, err)
				retry.Reset(s.cfg.RetryDelay)
			}
			continue
		}
		for kve := range w.Updates() {
			if kve == nil {
				if !s.eng.send(ctx, loaded) {
					break
				}
				continue
			}
			if fn := decode(kve); fn != nil && !s.eng.send(ctx, fn) {
				break
			}
			seen.update(kve.Revision())
		}
		_ = w.Stop()
		if ctx.Err() != nil {
			return
		}
		retry.Reset(s.cfg.RetryDelay)
	}
}

func (w *seqWaiter) current() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}
