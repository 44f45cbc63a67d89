package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Fleet-wide limits per kind (docs/protocol.md §2.4). Every agent mirrors
// bucket limits; before a job of a limited kind starts, its agent takes one
// of the kind's concurrency slots (a key created with a TTL, renewed while
// the job runs, deleted when it ends) and the kind's next start (a
// compare-and-set of the earliest next start time, one interval later).
// While it cannot, the job waits on the agent, as it does for the agent's
// own per-kind cap: it keeps its delivery (kept alive by +WPI) and its
// agent slot, spends no attempt, and its waiting event says why.

// rateSlack is how late a waiting agent may take a start and still keep
// the kind's schedule of starts (next = previous + interval, not now +
// interval): a timer woken late on a busy machine does not lower the rate.
// Up to one interval (at most a second): two starts may then come closer
// than an interval, never more of them in a period than the rate allows
// plus one; a kind idle for longer starts its schedule again from now.
func rateSlack(interval time.Duration) time.Duration { return min(interval, time.Second) }

// limitRetry is how soon a wait ends when nothing in the bucket changes
// (a missed watch update, an unreadable bucket).
const limitRetry = time.Second

type fleetLimits struct {
	kv      jetstream.KeyValue
	js      jetstream.JetStream
	agentID string
	logger  *slog.Logger

	// slotsMu serialises a renewal pass and a release: a release that read
	// a slot's revision while a renewal replaced it would miss, and the slot
	// would stay taken until its TTL.
	slotsMu sync.Mutex

	mu      sync.Mutex
	defs    map[string]limitDef      // by queue.kind
	taken   map[string]map[int]bool  // the kind's slots taken across the fleet
	rates   map[string]rateState     // the kind's next start, as last seen
	held    map[string]uint64        // slot key → revision, of this agent's jobs
	gates   map[string]chan struct{} // one acquirer per kind on this agent: first come, first served
	changed chan struct{}            // closed on every change in the bucket, then replaced
}

type limitDef struct {
	limit protocol.KindLimit
	err   error // the stored document is invalid: jobs wait until it is fixed
}

type rateState struct {
	next     time.Time
	revision uint64
}

func newFleetLimits(js jetstream.JetStream, kv jetstream.KeyValue, agentID string, logger *slog.Logger) *fleetLimits {
	return &fleetLimits{kv: kv, js: js, agentID: agentID, logger: logger, defs: map[string]limitDef{},
		taken: map[string]map[int]bool{}, rates: map[string]rateState{}, held: map[string]uint64{},
		gates: map[string]chan struct{}{}, changed: make(chan struct{})}
}

// apply mirrors one update of bucket limits.
func (l *fleetLimits) apply(entry jetstream.KeyValueEntry) {
	key, ok := protocol.ParseLimitKey(entry.Key())
	if !ok {
		return
	}
	qk := key.Queue + "." + key.Kind
	put := entry.Operation() == jetstream.KeyValuePut
	l.mu.Lock()
	defer l.mu.Unlock()
	switch key.Sort {
	case "def":
		if !put {
			delete(l.defs, qk)
			break
		}
		lim, err := protocol.ParseKindLimit(entry.Value())
		if err != nil {
			l.logger.Error("fleet-wide limit unreadable: the kind's jobs wait until it is fixed or deleted",
				"key", entry.Key(), telemetry.LogError, err)
		}
		l.defs[qk] = limitDef{limit: lim, err: err}
	case "slot":
		if l.taken[qk] == nil {
			l.taken[qk] = map[int]bool{}
		}
		if put {
			l.taken[qk][key.Slot] = true
		} else {
			delete(l.taken[qk], key.Slot)
		}
	case "rate":
		st := rateState{revision: entry.Revision()}
		if put {
			st.next = parseNanos(entry.Value())
		}
		if st.revision > l.rates[qk].revision {
			l.rates[qk] = st
		}
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

func parseNanos(b []byte) time.Time {
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// limited reports whether the kind has a fleet-wide limit.
func (l *fleetLimits) limited(queue, kind string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.defs[queue+"."+kind]
	return ok
}

// admit waits until the job may start under its kind's fleet-wide limit
// and returns what gives its concurrency slot back. onWait is called once,
// when the job first has to wait, with the reason. It returns the
// context's cause if ctx ends first.
func (l *fleetLimits) admit(ctx context.Context, queue, kind, jobID string, onWait func(reason string)) (release func(), err error) {
	qk := queue + "." + kind
	l.mu.Lock()
	gate := l.gates[qk]
	if gate == nil {
		gate = make(chan struct{}, 1)
		l.gates[qk] = gate
	}
	l.mu.Unlock()
	waited := false
	wait := func(reason string, changed <-chan struct{}, d time.Duration) error {
		if !waited {
			waited = true
			onWait(reason)
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		return nil
	}
	select {
	case gate <- struct{}{}:
	default:
		onWait("waiting behind other jobs of " + qk + " for its fleet-wide limit")
		waited = true
		select {
		case gate <- struct{}{}:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	defer func() { <-gate }()

	slotKey := ""
	release = func() {
		if slotKey != "" {
			l.releaseSlot(slotKey)
		}
	}
	for {
		l.mu.Lock()
		def, ok := l.defs[qk]
		changed := l.changed
		l.mu.Unlock()
		if !ok {
			return release, nil // lifted meanwhile
		}
		if def.err != nil {
			if err := wait("the fleet-wide limit of "+qk+" is invalid: "+def.err.Error(), changed, time.Minute); err != nil {
				release()
				return nil, err
			}
			continue
		}
		lim := def.limit
		if lim.Concurrency > 0 && slotKey == "" {
			key, inUse, err := l.takeSlot(ctx, queue, kind, lim.Concurrency, jobID)
			if err != nil {
				l.logger.Warn("fleet-wide limit: slot not taken; trying again", telemetry.LogJobID, jobID, telemetry.LogError, err)
			}
			if key == "" {
				reason := fmt.Sprintf("fleet-wide concurrency of %s: %d of %d running", qk, inUse, lim.Concurrency)
				if err := wait(reason, changed, limitRetry); err != nil {
					return nil, err
				}
				continue
			}
			slotKey = key
		}
		if lim.Rate > 0 {
			next, err := l.takeStart(ctx, queue, kind, lim.Interval())
			if err != nil {
				l.logger.Warn("fleet-wide limit: start not taken; trying again", telemetry.LogJobID, jobID, telemetry.LogError, err)
				next = time.Now().Add(limitRetry)
			}
			if !next.IsZero() {
				reason := fmt.Sprintf("fleet-wide rate of %s: %s; next start at %s", qk, lim, next.UTC().Format(time.RFC3339Nano))
				if err := wait(reason, nil, time.Until(next)); err != nil {
					release()
					return nil, err
				}
				continue
			}
		}
		return release, nil
	}
}

// takeSlot creates a free concurrency slot of the kind for the job; key
// is empty when every slot is taken (inUse of them).
func (l *fleetLimits) takeSlot(ctx context.Context, queue, kind string, n int, jobID string) (key string, inUse int, err error) {
	qk := queue + "." + kind
	l.mu.Lock()
	taken := make(map[int]bool, len(l.taken[qk]))
	for i := range l.taken[qk] {
		taken[i] = true
	}
	l.mu.Unlock()
	if len(taken) >= n { // slots above n (a lowered limit) count until they end
		return "", len(taken), nil
	}
	value, _ := json.Marshal(protocol.LimitSlot{AgentID: l.agentID, JobID: jobID})
	start := rand.IntN(n)
	for j := range n {
		i := (start + j) % n
		if taken[i] {
			continue
		}
		k := protocol.LimitSlotKey(queue, kind, i)
		opCtx, cancel := context.WithTimeout(ctx, asyncTimeout)
		rev, err := l.kv.Create(opCtx, k, value, jetstream.KeyTTL(protocol.LimitSlotTTL))
		cancel()
		if err == nil {
			l.mu.Lock()
			l.held[k] = rev
			l.mu.Unlock()
			return k, 0, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", len(taken), err
		}
		taken[i] = true
	}
	return "", len(taken), nil
}

// releaseSlot deletes a slot this agent holds, unless it was lost.
func (l *fleetLimits) releaseSlot(key string) {
	l.slotsMu.Lock()
	defer l.slotsMu.Unlock()
	l.mu.Lock()
	rev, ok := l.held[key]
	delete(l.held, key)
	l.mu.Unlock()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), asyncTimeout)
	defer cancel()
	if err := l.kv.Delete(ctx, key, jetstream.LastRevision(rev)); err != nil {
		// Its TTL frees it.
		l.logger.Warn("fleet-wide limit: slot not given back; it expires", "key", key, telemetry.LogError, err)
	}
}

// renewLoop renews this agent's slots so that they outlive their TTL only
// while their jobs run.
func (l *fleetLimits) renewLoop(ctx context.Context) {
	t := time.NewTicker(protocol.LimitSlotTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l.renewAll(ctx)
	}
}

// renewAll renews every slot this agent holds, one after the other.
func (l *fleetLimits) renewAll(ctx context.Context) {
	l.slotsMu.Lock()
	defer l.slotsMu.Unlock()
	l.mu.Lock()
	held := make(map[string]uint64, len(l.held))
	for k, rev := range l.held {
		held[k] = rev
	}
	l.mu.Unlock()
	for key, rev := range held {
		l.renew(ctx, key, rev)
	}
}

func (l *fleetLimits) renew(ctx context.Context, key string, rev uint64) {
	value, _ := json.Marshal(protocol.LimitSlot{AgentID: l.agentID})
	opCtx, cancel := context.WithTimeout(ctx, asyncTimeout)
	defer cancel()
	ack, err := l.js.PublishMsg(opCtx, &nats.Msg{Subject: "$KV." + protocol.BucketLimits + "." + key, Data: value},
		jetstream.WithMsgTTL(protocol.LimitSlotTTL), jetstream.WithExpectLastSequencePerSubject(rev))
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, still := l.held[key]; !still {
		return // released meanwhile
	}
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			delete(l.held, key)
			l.logger.Error("fleet-wide limit: a running job's slot expired (agent frozen or cut off longer than its TTL); the kind may exceed its concurrency until it ends",
				"key", key, "ttl", protocol.LimitSlotTTL)
			return
		}
		l.logger.Warn("fleet-wide limit: slot not renewed; trying again", "key", key, telemetry.LogError, err)
		return
	}
	l.held[key] = ack.Sequence
}

// takeStart takes the kind's next start: it returns the zero time once
// taken, or the time of the next start when it is not yet due.
func (l *fleetLimits) takeStart(ctx context.Context, queue, kind string, interval time.Duration) (time.Time, error) {
	qk, key := queue+"."+kind, protocol.LimitRateKey(queue, kind)
	for range 100 {
		l.mu.Lock()
		st := l.rates[qk]
		l.mu.Unlock()
		now := time.Now()
		if st.next.After(now) {
			return st.next, nil
		}
		// One interval after the previous start's slot, or after now when
		// the kind was idle: starts are never closer than interval.
		base := st.next
		if base.Before(now.Add(-rateSlack(interval))) {
			base = now
		}
		next := base.Add(interval)
		value := []byte(strconv.FormatInt(next.UnixNano(), 10))
		opCtx, cancel := context.WithTimeout(ctx, asyncTimeout)
		var rev uint64
		var err error
		if st.revision == 0 {
			rev, err = l.kv.Create(opCtx, key, value)
		} else {
			rev, err = l.kv.Update(opCtx, key, value, st.revision)
		}
		cancel()
		if err == nil {
			l.mu.Lock()
			if rev > l.rates[qk].revision {
				l.rates[qk] = rateState{next: next, revision: rev}
			}
			l.mu.Unlock()
			return time.Time{}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return time.Time{}, err
		}
		// Another agent took it: read where the schedule is now.
		opCtx, cancel = context.WithTimeout(ctx, asyncTimeout)
		entry, err := l.kv.Get(opCtx, key)
		cancel()
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			l.mu.Lock()
			l.rates[qk] = rateState{} // deleted: start it again
			l.mu.Unlock()
			continue
		}
		if err != nil {
			return time.Time{}, err
		}
		if entry != nil {
			l.mu.Lock()
			if entry.Revision() > l.rates[qk].revision {
				l.rates[qk] = rateState{next: parseNanos(entry.Value()), revision: entry.Revision()}
			}
			l.mu.Unlock()
		}
	}
	return time.Time{}, errors.New("the next start is contended without end")
}
