package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// Config describes one replica's elector.
type Config struct {
	// KV is the bucket of leases; its TTL must be TTL.
	KV jetstream.KeyValue
	// Key is the lease's key in KV.
	Key string
	// Holder names this replica in the lease's value.
	Holder string
	// Role names what the lease elects, for logs ("scheduler").
	Role string
	// TTL is the bucket's TTL: the server drops an unrenewed lease after it.
	TTL time.Duration
	// Renew is how often the leader renews; well inside TTL-TTL/5.
	Renew time.Duration
	// Acquire is how often a follower tries to take a free lease.
	Acquire time.Duration
	// Clock is the real clock in production: the TTL it races is measured
	// by the server. Defaults to clock.Real().
	Clock clock.Clock
	// Log receives leadership changes and renewal failures.
	Log *slog.Logger
	// OnChange is called, from the elector's goroutine, when leadership is
	// gained or lost. It may be nil.
	OnChange func(leading bool)
	// Conn, when set, is KV's connection: a write waiting for its reply
	// gives up when the connection moves to another server, and the next
	// attempt goes out on the new one. A request sent on a connection that
	// then went silent gets no reply even once the client has reconnected;
	// waiting for it to the deadline cost a leader its lease (the cluster
	// fault run's partition).
	Conn *nats.Conn
}

// Elector holds or seeks the leader lease. It takes the key with Create
// (which fails while someone holds it), renews it with a revision-checked
// Update well inside the TTL, and steps down on its own once its local
// deadline passes without a confirmed renewal. The deadline counts from the
// moment a write was sent, which is no later than the server's timestamp of
// that write, minus a margin of TTL/5: a leader therefore always stops acting
// before the server can let another replica take the key.
type Elector struct {
	cfg    Config
	margin time.Duration

	mu       sync.Mutex
	leading  bool
	deadline time.Time
	rev      uint64
	resigned bool
}

// Value is what the lease key holds.
type Value struct {
	Holder     string    `json:"holder"`
	AcquiredAt time.Time `json:"acquired_at"`
	RenewedAt  time.Time `json:"renewed_at"`
}

// New returns an elector; Run makes it seek the lease.
func New(cfg Config) *Elector {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func(bool) {}
	}
	if cfg.Role == "" {
		cfg.Role = "service"
	}
	return &Elector{cfg: cfg, margin: cfg.TTL / 5}
}

// Read returns the lease's current value: who leads, since when. It fails
// with jetstream.ErrKeyNotFound when nobody does.
func Read(ctx context.Context, kv jetstream.KeyValue, key string) (Value, error) {
	var v Value
	kve, err := kv.Get(ctx, key)
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(kve.Value(), &v); err != nil {
		return v, fmt.Errorf("lease %s: %w", key, err)
	}
	return v, nil
}

// IsLeader reports whether this replica holds the lease and its local
// deadline has not passed.
func (el *Elector) IsLeader() bool {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.leading && !el.resigned && el.cfg.Clock.Now().Before(el.deadline)
}

// Run seeks, holds and renews the lease until ctx ends.
func (el *Elector) Run(ctx context.Context) {
	clk := el.cfg.Clock
	timer := clk.NewTimer(0)
	defer timer.Stop()
	var acquiredAt time.Time
	for {
		select {
		case <-ctx.Done():
			el.stepDown("stopping")
			return
		case <-timer.C():
		}
		el.mu.Lock()
		leading, rev, deadline, resigned := el.leading, el.rev, el.deadline, el.resigned
		el.mu.Unlock()
		if resigned {
			el.stepDown("resigned")
			timer.Reset(time.Hour)
			continue
		}
		now := clk.Now()
		if !leading {
			acquiredAt = now
			newDeadline := now.Add(el.cfg.TTL - el.margin)
			newRev, err := el.write(ctx, 0, acquiredAt, now, newDeadline)
			if errors.Is(err, jetstream.ErrKeyExists) {
				var reclaimed bool
				if newRev, acquiredAt, reclaimed = el.reclaim(ctx, now, newDeadline); reclaimed {
					err = nil
				}
			}
			if err == nil {
				el.mu.Lock()
				el.leading, el.rev, el.deadline = true, newRev, newDeadline
				el.mu.Unlock()
				el.cfg.Log.Info("became "+el.cfg.Role+" leader", "holder", el.cfg.Holder)
				el.cfg.OnChange(true)
				timer.Reset(el.cfg.Renew)
			} else {
				if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
					el.cfg.Log.Debug("could not take the leader lease", telemetry.LogError, err)
				}
				timer.Reset(el.cfg.Acquire)
			}
			continue
		}
		if !now.Before(deadline) {
			el.stepDown("lease deadline passed without renewal")
			timer.Reset(el.cfg.Acquire)
			continue
		}
		// A renewal's reply after the current deadline could not make the
		// leader act longer anyway: the write gives up there.
		newRev, err := el.write(ctx, rev, acquiredAt, now, deadline)
		switch {
		case err == nil:
			el.mu.Lock()
			el.rev, el.deadline = newRev, now.Add(el.cfg.TTL-el.margin)
			el.mu.Unlock()
			timer.Reset(el.cfg.Renew)
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
			// An earlier renewal whose reply was lost may have been stored:
			// then the key is still ours, at a revision we did not see.
			if el.adopt(ctx) {
				timer.Reset(0) // renew at once from the adopted revision
				continue
			}
			el.stepDown("lease taken or expired: " + err.Error())
			timer.Reset(el.cfg.Acquire)
		case errors.Is(err, jetstream.ErrKeyNotFound):
			el.stepDown("lease taken or expired: " + err.Error())
			timer.Reset(el.cfg.Acquire)
		default:
			// Unknown outcome (timeout, disconnection): try again soon, and
			// give up at the deadline.
			el.cfg.Log.Warn("leader lease renewal failed", telemetry.LogError, err)
			timer.Reset(min(el.cfg.Renew/4+1, max(deadline.Sub(clk.Now()), 0)))
		}
	}
}

// adopt reads the lease after a renewal met an unexpected revision. When
// this replica still holds it (a renewal whose outcome was unknown was
// stored), it takes that revision, and the deadline that write earned: its
// renewed_at, the time this replica sent it, plus TTL minus the margin.
func (el *Elector) adopt(ctx context.Context) bool {
	gctx, cancel := context.WithTimeout(ctx, el.cfg.TTL-el.margin)
	defer cancel()
	kve, err := el.cfg.KV.Get(gctx, el.cfg.Key)
	if err != nil {
		return false
	}
	var v Value
	if json.Unmarshal(kve.Value(), &v) != nil || v.Holder != el.cfg.Holder {
		return false
	}
	deadline := v.RenewedAt.Add(el.cfg.TTL - el.margin)
	if !el.cfg.Clock.Now().Before(deadline) {
		return false
	}
	el.mu.Lock()
	el.rev, el.deadline = kve.Revision(), deadline
	el.mu.Unlock()
	el.cfg.Log.Info("leader lease renewal was stored although its reply was lost; keeping the lease", "revision", kve.Revision())
	return true
}

// reclaim takes back a lease that is still this replica's own: one it
// stepped down from at its local deadline (its renewals went unanswered
// through a disconnection, or it was frozen) and that the server has not
// dropped yet. A revision-checked update of the key, as a renewal, makes it
// the leader again at once instead of after the rest of the TTL; nobody
// else can have taken the key meanwhile, or its holder or revision would
// differ. It returns the new revision and when the lease was first acquired.
func (el *Elector) reclaim(ctx context.Context, now, until time.Time) (uint64, time.Time, bool) {
	gctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	kve, err := el.cfg.KV.Get(gctx, el.cfg.Key)
	if err != nil {
		return 0, time.Time{}, false
	}
	var v Value
	if json.Unmarshal(kve.Value(), &v) != nil || v.Holder != el.cfg.Holder {
		return 0, time.Time{}, false
	}
	rev, err := el.write(ctx, kve.Revision(), v.AcquiredAt, now, until)
	if err != nil {
		return 0, time.Time{}, false
	}
	el.cfg.Log.Info("took back its own "+el.cfg.Role+" lease, which the server still held", "revision", rev)
	return rev, v.AcquiredAt, true
}

// write creates the key (rev 0) or updates it at rev, giving up at until
// or when the connection moves (Config.Conn). A write whose reply was lost
// but which was stored shows as a revision mismatch at the next attempt,
// and adopt takes it.
//
// While no answer comes for a renewal interval, it sends the same write
// again, and takes the first answer of any copy. The stream of the bucket
// drops without an answer what reaches it while it elects a leader (its
// leader's node was cut off or killed; 4-9 s); a write that only waited
// would wait out until, and the leader would step down although the
// stream was back in time. Every copy carries the same expected revision,
// so at most one is stored: a later copy meets a revision conflict, read
// back as for a lost reply. The deadline counts from the first copy's
// sending, no later than any copy's store time.
func (el *Elector) write(ctx context.Context, rev uint64, acquiredAt, now, until time.Time) (uint64, error) {
	val, _ := json.Marshal(Value{Holder: el.cfg.Holder, AcquiredAt: acquiredAt.UTC(), RenewedAt: now.UTC()})
	wait := until.Sub(el.cfg.Clock.Now())
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if el.cfg.Conn != nil {
		defer cancelOnReconnect(wctx, el.cfg.Conn, cancel)()
	}
	type answer struct {
		rev uint64
		err error
	}
	resendAfter := max(el.cfg.Renew, reconnectCheck)
	answers := make(chan answer, max(int(wait/resendAfter), 0)+2) // every copy's, so none blocks
	sent, outstanding := 0, 0
	send := func() {
		sent++
		outstanding++
		go func() {
			var a answer
			if rev == 0 {
				a.rev, a.err = el.cfg.KV.Create(wctx, el.cfg.Key, val)
			} else {
				a.rev, a.err = el.cfg.KV.Update(wctx, el.cfg.Key, val, rev)
			}
			answers <- a
		}()
	}
	send()
	resend := time.NewTicker(resendAfter)
	defer resend.Stop()
	for {
		select {
		case a := <-answers:
			outstanding--
			// A copy that ended without an answer (no responders, the
			// deadline) leaves the others to answer.
			if isAnswer(a.err) || outstanding == 0 {
				return a.rev, a.err
			}
		case <-resend.C:
			if sent < cap(answers) {
				send()
			}
		}
	}
}

// isAnswer reports whether err (nil included) is JetStream's answer to a
// write, rather than the lack of one.
func isAnswer(err error) bool {
	var apiErr *jetstream.APIError
	return err == nil || errors.As(err, &apiErr)
}

// reconnectCheck is how often a waiting write looks for a reconnection.
const reconnectCheck = 50 * time.Millisecond

// cancelOnReconnect calls cancel if nc reconnects before ctx ends; the
// returned func stops watching.
func cancelOnReconnect(ctx context.Context, nc *nats.Conn, cancel context.CancelFunc) (stop func()) {
	start := nc.Stats().Reconnects
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(reconnectCheck)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-done:
				return
			case <-tick.C:
				if nc.Stats().Reconnects != start {
					cancel()
					return
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (el *Elector) stepDown(reason string) {
	el.mu.Lock()
	was := el.leading
	el.leading = false
	el.mu.Unlock()
	if was {
		el.cfg.Log.Info("stepped down as "+el.cfg.Role+" leader", "reason", reason)
		el.cfg.OnChange(false)
	}
}

// Resign makes IsLeader false at once; Run steps down next and stops
// seeking the lease.
func (el *Elector) Resign() {
	el.mu.Lock()
	el.resigned = true
	el.mu.Unlock()
}

// Release deletes the lease if this replica still holds its last revision,
// so that another replica can take over without waiting for the TTL.
func (el *Elector) Release(ctx context.Context) {
	el.mu.Lock()
	rev := el.rev
	el.rev = 0
	el.mu.Unlock()
	if rev == 0 {
		return
	}
	if err := el.cfg.KV.Delete(ctx, el.cfg.Key, jetstream.LastRevision(rev)); err != nil &&
		!errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		el.cfg.Log.Debug("could not release the leader lease", telemetry.LogError, err)
	}
}

// ValidKey reports whether k can name a lease: a key-value key (letters,
// digits, '-', '_', '/', '=', '.'; no leading or trailing '.').
func ValidKey(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '/', r == '=', r == '.':
		default:
			return false
		}
	}
	return k[0] != '.' && k[len(k)-1] != '.'
}
