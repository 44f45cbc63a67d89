package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"
)

// Scenario scheduler-leader: 50 schedules firing every second (kind tick)
// under three scheduler replicas. The leader is killed with kill -9 and
// started again several times, and once frozen with SIGSTOP for 13s, then
// SIGCONT. Every (schedule, nominal time) in the run's range must run
// exactly once, and no `missed` event may name a time that ran.

// freezeFor is how long the leader stays stopped: past the lease TTL (5s),
// past the misfire threshold (10s).
const freezeFor = 13 * time.Second

func runSchedulerLeader(ctx context.Context, env *runEnv, f *fleet, r *row) error {
	ids, err := addSchedules(ctx, f, "tick", 50)
	if err != nil {
		return err
	}
	from := time.Now().Truncate(time.Second).Unix() + 2 // every schedule exists by then
	faultsFrom := time.Now()
	steady := env.duration(6*time.Second, 5*time.Second)
	kills := env.scale(10, 2)

	var takeovers []time.Duration
	if err := pause(ctx, steady); err != nil {
		return err
	}
	for i := range kills {
		if i == kills/2 {
			took, err := freezeLeader(ctx, env, f, "scheduler")
			if err != nil {
				return err
			}
			if took > 0 {
				r.note("SIGSTOP %s: a new leader after %.1fs", freezeFor, took.Seconds())
			} else {
				r.note("SIGSTOP %s: no other leader while it was stopped", freezeFor)
			}
			if err := pause(ctx, steady); err != nil {
				return err
			}
		}
		took, err := killLeader(ctx, env, f, "scheduler")
		if err != nil {
			return err
		}
		takeovers = append(takeovers, took)
		if err := pause(ctx, steady); err != nil {
			return err
		}
	}
	to, stopped, err := stopSchedulers(f)
	if err != nil {
		return err
	}
	for _, n := range f.settle(ctx, 0, 60*time.Second) {
		r.note("%s", n)
	}
	snap, err := f.snapshot(ctx)
	if err != nil {
		return err
	}
	t := snap.tallyFires(ids, from, to, faultsFrom, stopped)
	r.published, r.runOnce, r.runTwice = t.pairs, t.once, t.twice
	r.deadLetters = len(snap.lettersByJob())
	t.apply(r)
	r.note("%d leader kills, new leader after %s", kills, durations(takeovers))
	snap.historyVsExecutions(r)
	snap.repeatedTerminalEvents(r)
	snap.concurrency(r)
	return nil
}

// addSchedules adds n schedules firing every second with the CLI:
// jetfleet schedule add -every 1s -kind tick <prefix>-NN.
func addSchedules(ctx context.Context, f *fleet, prefix string, n int) ([]string, error) {
	ids := make([]string, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%02d", prefix, i+1)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			_, errs[i] = f.cli(ctx, "schedule", "add", "-every", "1s", "-kind", kindTick, ids[i])
		})
	}
	wg.Wait()
	return ids, errors.Join(errs...)
}

// killLeader kills role's leader with kill -9, starts a new process in its
// place and returns how long it took until another process led.
func killLeader(ctx context.Context, env *runEnv, f *fleet, role string) (time.Duration, error) {
	m, err := f.awaitLeader(ctx, role, "", 30*time.Second)
	if err != nil {
		return 0, err
	}
	old := f.holderOf(m)
	env.log.Debug("kill -9 leader", "member", m.String(), "pid", f.proc(m).pid())
	killed := time.Now()
	if err := f.proc(m).kill(); err != nil {
		return 0, err
	}
	if err := f.start(ctx, m); err != nil {
		return 0, err
	}
	if _, err := f.awaitLeader(ctx, role, old, 30*time.Second); err != nil {
		return 0, err
	}
	return time.Since(killed), nil
}

// freezeLeader stops role's leader with SIGSTOP for freezeFor, then
// continues it; it returns how long it took until another process led (0:
// none did while it was stopped).
func freezeLeader(ctx context.Context, env *runEnv, f *fleet, role string) (time.Duration, error) {
	m, err := f.awaitLeader(ctx, role, "", 30*time.Second)
	if err != nil {
		return 0, err
	}
	p := f.proc(m)
	env.log.Debug("SIGSTOP leader", "member", m.String(), "pid", p.pid(), "for", freezeFor)
	stopped := time.Now()
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return 0, err
	}
	defer func() { _ = p.signal(syscall.SIGCONT) }()
	newLeader, err := f.awaitLeader(ctx, role, f.holderOf(m), freezeFor)
	took := time.Since(stopped)
	if err != nil || newLeader == nil {
		took = 0
	}
	if err := pause(ctx, freezeFor-time.Since(stopped)); err != nil {
		return 0, err
	}
	env.log.Debug("SIGCONT", "member", m.String(), "pid", p.pid())
	return took, nil
}

// stopSchedulers stops every scheduler (SIGTERM), so nothing fires while
// the run is counted. It returns the last nominal time (Unix seconds) every
// schedule must have fired by then, and when the stop began.
func stopSchedulers(f *fleet) (to int64, stopped time.Time, err error) {
	stopped = time.Now()
	var errs []error
	for _, m := range f.schedulers {
		errs = append(errs, f.proc(m).stop(10*time.Second))
	}
	return stopped.Unix() - 2, stopped, errors.Join(errs...)
}

// pause lets the fleet run for d: a phase of the scenario, not a wait for
// something to happen.
func pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	lo, hi := ds[0], ds[0]
	for _, d := range ds {
		lo, hi = min(lo, d), max(hi, d)
	}
	return fmt.Sprintf("%.1f-%.1fs", lo.Seconds(), hi.Seconds())
}
