package main

import (
	"context"
	"time"
)

// Scenario agents-killed: jobs of kind fx published at a steady pace while
// a random agent is killed with kill -9 every few seconds and started
// again (same agent id, a new process). Every acknowledged job must run or
// be dead-lettered; a job may run twice only when its program finished
// just before its agent was killed, before the succeeded event was stored
// (at-least-once: reported, not failed).
func runAgentsKilled(ctx context.Context, env *runEnv, f *fleet, r *row) error {
	n := env.scale(7500, 1500)
	phase := env.duration(60*time.Second, 15*time.Second)
	every := env.duration(2*time.Second, 2500*time.Millisecond)

	pb := newPublisher(f.js)
	published := make(chan struct{})
	go func() {
		defer close(published)
		pb.publishAll(ctx, paced(ctx, n, phase, func(i int) jobSpec { return effectJob("agents", i) }), 8)
	}()
	kills := 0
	tick := time.NewTicker(every)
	defer tick.Stop()
faults:
	for {
		select {
		case <-ctx.Done():
			<-published
			return ctx.Err()
		case <-published:
			break faults
		case <-tick.C:
			m := f.agents[env.rng.IntN(len(f.agents))]
			env.log.Debug("kill -9", "member", m.String(), "pid", f.proc(m).pid())
			if err := f.restart(ctx, m); err != nil {
				<-published
				return err
			}
			kills++
		}
	}
	for _, n := range f.settle(ctx, 0, env.duration(90*time.Second, 45*time.Second)) {
		r.note("%s", n)
	}
	snap, err := f.snapshot(ctx)
	if err != nil {
		return err
	}
	snap.tallyJobs(pb.published(), f.finalProcesses()).apply(r)
	r.note("%d agent kills over %s", kills, phase)
	if u := pb.notAcknowledged(); u > 0 {
		r.note("%d publishes never acknowledged (not counted)", u)
	}
	snap.historyVsExecutions(r)
	snap.repeatedTerminalEvents(r)
	snap.concurrency(r)
	return nil
}
