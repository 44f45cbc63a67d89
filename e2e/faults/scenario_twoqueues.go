package main

import (
	"context"
	"time"
)

// Scenario two-queues: every agent serves two queues, default and other;
// jobs of kind fx arrive on default only, nothing on other. Every job must
// run: an idle queue must not hold the slots of a busy one.
func runTwoQueues(ctx context.Context, env *runEnv, f *fleet, r *row) error {
	n := env.scale(1000, 300)
	phase := env.duration(10*time.Second, 5*time.Second)
	pb := newPublisher(f.js)
	pb.publishAll(ctx, paced(ctx, n, phase, func(i int) jobSpec { return effectJob("twoq", i) }), 4)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	for _, n := range f.settle(ctx, 0, env.duration(30*time.Second, 15*time.Second)) {
		r.note("%s", n)
	}
	snap, err := f.snapshot(ctx)
	if err != nil {
		return err
	}
	snap.tallyJobs(pb.published(), f.finalProcesses()).apply(r)
	for _, c := range snap.consumers {
		r.note("%s: %d pending, %d unacknowledged", c.name, c.pending, c.ackPending)
	}
	snap.historyVsExecutions(r)
	snap.repeatedTerminalEvents(r)
	snap.concurrency(r)
	return nil
}
