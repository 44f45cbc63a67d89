package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Checks of a definition that need the time or the server, before it is stored.

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
