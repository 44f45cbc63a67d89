// Package replica is what every replica of a role that elects one leader
// shares — the scheduler's and the supervisor's: a holder name unique to the
// process, the leader lease (pkg/lease), the flag that says when this
// replica acts as the leader, and the leader's tasks, each run while the
// replica leads and stopped the moment it does not.
//
// The lease alone does not make a replica act: Leading does. A role whose
// leader must first catch up (the scheduler reads what its predecessor
// wrote) sets it itself once ready (Config.SetsLeading); otherwise it is set
// when the lease is won, after OnChange and before the tasks start.
package replica

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/lease"
	"github.com/jetfleet/jetfleet/pkg/lifecycle"
)

// Task is work only the leader does, such as consuming a stream with a
// durable consumer of the leader's. Lead runs in its own goroutine from the
// moment the replica leads until ctx ends: leadership lost, or the replica
// stopping.
type Task struct {
	Name string
	Lead func(ctx context.Context)
}

// Config describes one replica.
type Config struct {
	// Role names the role in logs and in the lease ("scheduler").
	Role string
	// Name prefixes the holder name, which ends in a random part so that
	// every process has its own. Defaults to Role.
	Name string
	// Leases is the bucket of leader leases; TTL its TTL (topology.lease_ttl).
	Leases jetstream.KeyValue
	TTL    time.Duration
	// Conn is the connection of Leases (lease.Config.Conn).
	Conn *nats.Conn
	// Lease holds the key and timings (with defaults applied).
	Lease lease.Settings
	Log   *slog.Logger
	// OnChange is told, from the elector's goroutine, when the lease is
	// won or lost, before the tasks start or after they were told to stop.
	OnChange func(leading bool)
	// SetsLeading: the role calls SetLeading(true) itself once it may act.
	SetsLeading bool
	// Tasks run while the replica leads, each in its own goroutine.
	Tasks []Task
}

// Replica is one replica's share of its role's leadership.
type Replica struct {
	cfg    Config
	holder string
	el     *lease.Elector
	runner *lifecycle.Runner

	leading lifecycle.Flag

	mu     sync.Mutex
	cancel context.CancelFunc // of the running tasks
}

// New returns a replica of cfg.Role; Start runs its election.
func New(cfg Config) *Replica {
	if cfg.Name == "" {
		cfg.Name = cfg.Role
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Replica{cfg: cfg, holder: cfg.Name + "-" + nuid.Next()}
}

// Holder is the replica's name in the lease.
func (r *Replica) Holder() string { return r.holder }

// Start competes for the lease from now on, with its goroutine — and the
// tasks' — on runner (the role's: the role's Stop waits for them).
func (r *Replica) Start(runner *lifecycle.Runner) {
	r.runner = runner
	r.el = lease.New(lease.Config{KV: r.cfg.Leases, Key: r.cfg.Lease.LeaseKey, Holder: r.holder, Role: r.cfg.Role,
		TTL: r.cfg.TTL, Renew: r.cfg.Lease.RenewInterval, Acquire: r.cfg.Lease.AcquireInterval, Clock: clock.Real(),
		Log: r.cfg.Log, OnChange: r.onChange, Conn: r.cfg.Conn})
	runner.Go(r.el.Run)
}

// onChange starts the tasks when the lease is won and stops them when it
// is lost. Called from the elector's goroutine.
func (r *Replica) onChange(leading bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		r.cancel()
		r.cancel = nil
	}
	r.leading.Set(false)
	if r.cfg.OnChange != nil {
		r.cfg.OnChange(leading)
	}
	ctx := r.runner.Context()
	if !leading || ctx.Err() != nil {
		return
	}
	if !r.cfg.SetsLeading {
		r.leading.Set(true)
	}
	ctx, r.cancel = context.WithCancel(ctx)
	for _, t := range r.cfg.Tasks {
		r.runner.Go(func(context.Context) { t.Lead(ctx) })
	}
}

// SetLeading says whether the replica acts as the leader, for a role that
// sets it itself (Config.SetsLeading).
func (r *Replica) SetLeading(leading bool) { r.leading.Set(leading) }

// IsLeader reports whether the replica holds the lease by its own deadline
// and acts as the leader.
func (r *Replica) IsLeader() bool { return r.HoldsLease() && r.leading.Get() }

// HoldsLease reports whether the replica holds the lease by its own
// deadline (acting or not yet).
func (r *Replica) HoldsLease() bool { return r.el != nil && r.el.IsLeader() }

// WaitLeading waits until the replica leads (or, with false, does not), or
// ctx ends.
func (r *Replica) WaitLeading(ctx context.Context, leading bool) error {
	return r.leading.Wait(ctx, leading)
}

// Resign stops the replica from leading at once (IsLeader turns false) and
// from seeking the lease again: the first step of stopping.
func (r *Replica) Resign() {
	if r.el != nil {
		r.el.Resign()
	}
}

// Release deletes the lease if the replica still holds it, so another
// replica takes over without waiting for the TTL: the last step of
// stopping, once the role's goroutines are done.
func (r *Replica) Release(ctx context.Context) {
	if r.el != nil {
		r.el.Release(ctx)
	}
}
