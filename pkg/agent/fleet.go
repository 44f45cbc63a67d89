package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/lifecycle"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// fleetView watches the agents bucket to know which live agents run which
// kinds, so a job of a kind this agent does not run is passed on rather
// than dead-lettered when another agent of its queue runs it.
type fleetView struct {
	kv     jetstream.KeyValue
	self   string
	logger *slog.Logger

	mu     sync.Mutex
	agents map[string]registration
	// serverNow is the newest storage time seen in the bucket: every agent,
	// this one included, writes each heartbeat, so it tracks the server's
	// clock without consulting ours.
	serverNow time.Time
}

// registration is an agent's latest heartbeat and when the server stored it.
// Freshness is judged on the server's clock alone (not the sender's sent_at,
// nor this host's clock), so clocks that disagree between hosts do not matter.
type registration struct {
	hb     *jetfleetpb.Heartbeat
	stored time.Time
}

func newFleetView(kv jetstream.KeyValue, self string, logger *slog.Logger) *fleetView {
	return &fleetView{kv: kv, self: self, logger: logger, agents: map[string]registration{}}
}

// start loads the registrations already in the bucket (while ctx allows),
// then follows its changes until runCtx ends: a job delivered right after
// the agent starts must see the agents that were live before it.
func (f *fleetView) start(ctx, runCtx context.Context, runner *lifecycle.Runner) error {
	return mirrorBucket(ctx, runCtx, runner, f.kv, f.apply)
}

// mirrorBucket applies every entry of kv to apply: those stored now before
// it returns (while ctx allows), the later changes on a goroutine of runner
// until runCtx ends.
func mirrorBucket(ctx, runCtx context.Context, runner *lifecycle.Runner, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry)) error {
	w, err := kv.WatchAll(runCtx)
	if err != nil {
		return err
	}
	if err := loadInitial(ctx, w, apply); err != nil {
		_ = w.Stop()
		return fmt.Errorf("bucket %s: %w", kv.Bucket(), err)
	}
	runner.Go(func(context.Context) {
		defer func() { _ = w.Stop() }()
		for entry := range w.Updates() {
			if entry != nil {
				apply(entry)
			}
		}
	})
	return nil
}

// loadInitial applies the watcher's initial values, up to the nil entry
// that marks their end.
func loadInitial(ctx context.Context, w jetstream.KeyWatcher, apply func(jetstream.KeyValueEntry)) error {
	for {
		select {
		case entry, ok := <-w.Updates():
			if !ok {
				return errors.New("watch closed while loading")
			}
			if entry == nil {
				return nil
			}
			apply(entry)
		case <-ctx.Done():
			return fmt.Errorf("loading: %w", ctx.Err())
		}
	}
}

func (f *fleetView) apply(entry jetstream.KeyValueEntry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if entry.Operation() != jetstream.KeyValuePut {
		delete(f.agents, entry.Key())
		return
	}
	var hb jetfleetpb.Heartbeat
	if err := protocol.Unmarshal(entry.Value(), &hb); err != nil {
		f.logger.Debug("unreadable agent registration", telemetry.LogAgentID, entry.Key(), telemetry.LogError, err)
		return
	}
	f.agents[entry.Key()] = registration{hb: &hb, stored: entry.Created()}
	if entry.Created().After(f.serverNow) {
		f.serverNow = entry.Created()
	}
}

// runnerOf returns a live agent, other than this one, that pulls queue and
// runs kind, or "".
func (f *fleetView) runnerOf(queue, kind string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, reg := range f.agents {
		hb := reg.hb
		if id == f.self || !protocol.RegistrationLive(hb, reg.stored, f.serverNow) {
			continue
		}
		if slices.Contains(hb.GetQueues(), queue) && (len(hb.GetKinds()) == 0 || slices.Contains(hb.GetKinds(), kind)) {
			return id
		}
	}
	return ""
}
