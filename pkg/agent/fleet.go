package agent

import (
	"context"
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
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	self   string
	logger *slog.Logger

	mu     sync.Mutex
	agents map[string]registration
	// serverNow is the newest storage time seen in the bucket: every agent,
	// this one included, writes each heartbeat, so it tracks the server's
	// clock without consulting ours.
	serverNow time.Time

	// refreshMu guards the bucket reads of confirmedRunnerOf: one at a time,
	// and callers that arrive during one share the next.
	refreshMu  sync.Mutex
	refreshing bool
	next       *refreshCall
	runner     *lifecycle.Runner // the agent's, set by start: reads end with it
}

// refreshCall is one read of the whole bucket, awaited by its callers.
type refreshCall struct {
	done chan struct{}
	err  error
}

// registration is an agent's latest heartbeat, when the server stored it,
// and its revision in the bucket (a read of the bucket never replaces a
// newer one the watch delivered).
// Freshness is judged on the server's clock alone (not the sender's sent_at,
// nor this host's clock), so clocks that disagree between hosts do not matter.
type registration struct {
	hb       *jetfleetpb.Heartbeat
	stored   time.Time
	revision uint64
}

func newFleetView(js jetstream.JetStream, kv jetstream.KeyValue, self string, logger *slog.Logger) *fleetView {
	return &fleetView{js: js, kv: kv, self: self, logger: logger, agents: map[string]registration{}}
}

// start loads the registrations already in the bucket (while ctx allows),
// then follows its changes until runCtx ends: a job delivered right after
// the agent starts must see the agents that were live before it.
func (f *fleetView) start(ctx, runCtx context.Context, runner *lifecycle.Runner) error {
	f.runner = runner
	return mirrorBucket(ctx, runCtx, runner, f.js, f.kv, f.apply)
}

// mirrorBucket applies every entry of kv to apply: those stored now before
// it returns (while ctx allows), the later changes on a goroutine of runner
// until runCtx ends.
func mirrorBucket(ctx, runCtx context.Context, runner *lifecycle.Runner, js jetstream.JetStream, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry)) error {
	w, err := kv.WatchAll(runCtx)
	if err != nil {
		return err
	}
	if err := protocol.AwaitCurrent(ctx, js, kv.Bucket(), ">", w, apply); err != nil {
		_ = w.Stop()
		return err // it names the bucket
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

func (f *fleetView) apply(entry jetstream.KeyValueEntry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if entry.Operation() != jetstream.KeyValuePut {
		delete(f.agents, entry.Key())
		return
	}
	if known, ok := f.agents[entry.Key()]; ok && known.revision > entry.Revision() {
		return
	}
	var hb jetfleetpb.Heartbeat
	if err := protocol.Unmarshal(entry.Value(), &hb); err != nil {
		f.logger.Debug("unreadable agent registration", telemetry.LogAgentID, entry.Key(), telemetry.LogError, err)
		return
	}
	f.agents[entry.Key()] = registration{hb: &hb, stored: entry.Created(), revision: entry.Revision()}
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

// confirmedRunnerOf is runnerOf, asked again of the bucket itself before it
// says no: the watch may not have delivered yet the registration of an agent
// that started a moment ago, and a job of its kind would be dead-lettered as
// unknown although the agent that runs it is live.
func (f *fleetView) confirmedRunnerOf(ctx context.Context, queue, kind string) string {
	if id := f.runnerOf(queue, kind); id != "" {
		return id
	}
	if err := f.refresh(ctx); err != nil {
		f.logger.Warn("cannot read the agents bucket to confirm an unknown kind; judging on the watched registrations",
			telemetry.LogQueue, queue, telemetry.LogKind, kind, telemetry.LogError, err)
	}
	return f.runnerOf(queue, kind)
}

// refresh applies every registration stored now, read after the call
// began. Calls that arrive while a read runs share the next read, so a
// burst of jobs of an unknown kind costs a few reads, not one each.
func (f *fleetView) refresh(ctx context.Context) error {
	f.refreshMu.Lock()
	if f.next == nil {
		f.next = &refreshCall{done: make(chan struct{})}
	}
	call := f.next
	if !f.refreshing {
		f.refreshing, f.next = true, nil
		f.refreshMu.Unlock()
		// On its own goroutine: this caller may give up, the others still wait.
		f.runner.Go(func(runCtx context.Context) { f.runRefreshes(runCtx, call) })
	} else {
		f.refreshMu.Unlock()
	}
	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// refreshTimeout bounds one read of the agents bucket.
const refreshTimeout = 5 * time.Second

// runRefreshes reads the bucket for call, then for each next call that
// callers queued meanwhile.
func (f *fleetView) runRefreshes(runCtx context.Context, call *refreshCall) {
	for call != nil {
		ctx, cancel := context.WithTimeout(runCtx, refreshTimeout)
		call.err = f.readBucket(ctx)
		cancel()
		close(call.done)
		f.refreshMu.Lock()
		call, f.next = f.next, nil
		f.refreshing = call != nil
		f.refreshMu.Unlock()
	}
}

// readBucket applies the bucket's current registrations.
func (f *fleetView) readBucket(ctx context.Context) error {
	entries, err := protocol.ReadBucket(ctx, f.js, f.kv, ">", false)
	if err != nil {
		return err
	}
	for _, e := range entries {
		f.apply(e)
	}
	return nil
}
