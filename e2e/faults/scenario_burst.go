package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Scenario unknown-burst: a burst of jobs of a kind no agent runs,
// published as fast as JetStream takes them. Each must be dead-lettered
// once (reason unknown_kind), and the supervisor's history must hold one
// record per job: agents write those dead letters and their events in
// fast batches, and a batch that gets no answer in time must not be stored
// twice.
func runUnknownBurst(ctx context.Context, env *runEnv, f *fleet, r *row) error {
	n := env.scale(10000, 2000)
	pb := newPublisher(f.js)
	start := time.Now()
	specs := make([]jobSpec, n)
	for i := range specs {
		specs[i] = jobSpec{subject: protocol.JobSubject(queueDefault, "nosuchkind"), id: fmt.Sprintf("burst-%06d", i)}
	}
	pb.publishBurst(ctx, specs)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.note("%d jobs published in %.1fs", len(pb.published()), time.Since(start).Seconds())
	for _, n := range f.settle(ctx, 0, env.duration(3*time.Minute, 90*time.Second)) {
		r.note("%s", n)
	}
	snap, err := f.snapshot(ctx)
	if err != nil {
		return err
	}
	snap.tallyJobs(pb.published(), f.finalProcesses()).apply(r)
	reasons := map[string]int{}
	letters := 0
	for _, ls := range snap.lettersByJob() {
		for _, l := range ls {
			reasons[l.reason]++
			letters++
		}
	}
	r.note("%d dead letters: %s", letters, countsOf(reasons))
	if letters > r.deadLetters {
		r.fail("%d dead letters for %d dead-lettered jobs", letters, r.deadLetters)
	}
	snap.historyVsExecutions(r)
	snap.repeatedTerminalEvents(r)
	snap.concurrency(r)
	return nil
}
