package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Scenario supervisor-killed: poison jobs — a kind whose exit code is
// non-retryable, a kind that fails every attempt, and two kinds whose
// program kills the agent running it (a crash loop: dead-lettered by the
// supervisor once MaxDeliver is reached; or, with max_attempts 2, by the
// agent at the third delivery) — among ordinary jobs, with two supervisor
// replicas; the leading one is killed with kill -9 twice, the second time
// as the first crash loop is dead-lettered. Every poison job
// must have exactly one dead letter; no ordinary job may be lost.
func runSupervisorKilled(ctx context.Context, env *runEnv, f *fleet, r *row) error {
	phase := env.duration(40*time.Second, 15*time.Second)
	var poison []jobSpec
	addPoison := func(queue, kind string, n int) {
		for i := range n {
			poison = append(poison, jobSpec{subject: protocol.JobSubject(queue, kind), id: fmt.Sprintf("poison-%s-%03d", kind, i)})
		}
	}
	addPoison(queueDefault, kindNonRetryable, env.scale(40, 10))
	addPoison(queueDefault, kindFlaky, env.scale(40, 10))
	addPoison(queueDefault, kindCrash, env.scale(6, 3))
	addPoison(queueDefault, kindCrashCapped, env.scale(4, 2))
	ordinary := env.scale(2000, 400)

	keeperCtx, stopKeeper := context.WithCancel(ctx)
	restarts := keepAgentsAlive(keeperCtx, env, f)
	defer stopKeeper()

	pb := newPublisher(f.js)
	for _, spec := range poison {
		if _, err := pb.publish(ctx, spec); err != nil {
			return err
		}
	}
	published := make(chan struct{})
	go func() {
		defer close(published)
		pb.publishAll(ctx, paced(ctx, ordinary, phase, func(i int) jobSpec { return effectJob("ordinary", i) }), 4)
	}()
	// The first kill while the crash jobs' agents are being rescued; the
	// second as soon as the supervisor dead-letters the first crash loop
	// (reason max_deliveries), so that the rest reach MaxDeliver around a
	// change of leader.
	var takeovers []time.Duration
	kill := func() error {
		took, err := killLeader(ctx, env, f, "supervisor")
		takeovers = append(takeovers, took)
		return err
	}
	err := pause(ctx, phase/5)
	if err == nil {
		err = kill()
	}
	if err == nil {
		if waitFor(ctx, 2*phase, func(ctx context.Context) (bool, error) {
			ls, err := f.letters(ctx)
			return slices.ContainsFunc(ls, func(l letter) bool { return l.reason == protocol.ReasonMaxDeliveries }), err
		}) != nil {
			r.note("no max_deliveries dead letter within %s: the second kill came without it", 2*phase)
		}
		err = kill()
	}
	<-published
	if err != nil {
		return err
	}
	// Every poison job dead-lettered, then JOBS empty and the history caught up.
	_ = waitFor(ctx, env.duration(3*time.Minute, 90*time.Second), func(ctx context.Context) (bool, error) {
		ls, err := f.letters(ctx)
		if err != nil {
			return false, err
		}
		done := map[string]bool{}
		for _, l := range ls {
			done[l.jobID] = true
		}
		for _, p := range poison {
			if !done[p.id] {
				return false, nil
			}
		}
		return true, nil
	})
	for _, n := range f.settle(ctx, 0, 60*time.Second) {
		r.note("%s", n)
	}
	stopKeeper()
	snap, err := f.snapshot(ctx)
	if err != nil {
		return err
	}
	snap.tallyJobs(pb.published(), f.finalProcesses()).apply(r)

	letters := snap.lettersByJob()
	var missing, dup []string
	reasons := map[string]int{}
	for _, p := range poison {
		ls := letters[p.id]
		switch {
		case len(ls) == 0:
			missing = append(missing, p.id)
		case len(ls) > 1:
			dup = append(dup, fmt.Sprintf("%s ×%d", p.id, len(ls)))
		}
		for _, l := range ls {
			reason := l.reason
			if l.code == protocol.CodeAgentLost {
				reason += "/" + l.code
			}
			reasons[kindOf(p.subject)+":"+reason]++
		}
	}
	if len(missing) > 0 {
		r.fail("%d of %d poison jobs have no dead letter: %s", len(missing), len(poison), strings.Join(missing, " "))
	}
	if len(dup) > 0 {
		r.fail("%d poison jobs have more than one dead letter: %s", len(dup), strings.Join(dup, " "))
	}
	r.note("dead letters of %d poison jobs: %s", len(poison), countsOf(reasons))
	r.note("supervisor leader killed %d×, new leader after %s", len(takeovers), durations(takeovers))
	r.note("agents restarted after crash jobs killed them: %d", restarts.Load())
	snap.historyVsExecutions(r)
	snap.repeatedTerminalEvents(r)
	snap.concurrency(r)
	return nil
}

// keepAgentsAlive starts a new process for every agent whose process ends
// without the harness having signalled it (a crash job killed it), until
// ctx ends; it counts the restarts.
func keepAgentsAlive(ctx context.Context, env *runEnv, f *fleet) *atomic.Int64 {
	var restarts atomic.Int64
	for _, m := range f.agents {
		go func() {
			for {
				p := f.proc(m)
				select {
				case <-ctx.Done():
					return
				case <-p.done:
				}
				if p.signalled.Load() || ctx.Err() != nil {
					return
				}
				env.log.Debug("agent died, starting it again", "member", m.String(), "exit", p.waitErr)
				if err := f.start(ctx, m); err != nil {
					env.log.Debug("agent restart", "member", m.String(), "error", err)
				}
				restarts.Add(1)
			}
		}()
	}
	return &restarts
}

func countsOf(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
