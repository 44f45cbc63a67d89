package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Scenario nats-restart: a backlog of jobs of kind work (200ms each, so
// that every agent runs its six at once) kept topped up, and 20 schedules
// firing every second, while the NATS server is stopped and started again
// on the same port and store, down for 6s: once with SIGTERM, once with
// SIGKILL. No job
// may be lost, no fire doubled or missed, no `missed` event false, no agent
// over its concurrency; fires must resume within resumeTarget of the server
// accepting connections again (issue 16, item 7).

const (
	// backlog is how many jobs the feeder keeps pending in queue default.
	backlog = 150
	// resumeTarget bounds the time from the restarted server accepting
	// connections to the next stored fire.
	resumeTarget = 2 * time.Second
	// downFor is how long the server stays down: longer than an agent's
	// pull request may go unanswered (1s expiry + 2s margin), so that
	// requests are counted lost; shorter than the misfire threshold (10s),
	// so that every fire is due to run late rather than be missed.
	downFor = 6 * time.Second
)

// serverRestart is one stop and start of the server.
type serverRestart struct {
	sig     syscall.Signal
	halted  time.Time
	readyAt time.Time
}

func runNATSRestart(ctx context.Context, env *runEnv, f *fleet, r *row) error {
	ids, err := addSchedules(ctx, f, "tock", 20)
	if err != nil {
		return err
	}
	from := time.Now().Truncate(time.Second).Unix() + 2
	faultsFrom := time.Now()
	steady := env.duration(15*time.Second, 8*time.Second)

	pb := newPublisher(f.js)
	feedCtx, stopFeeding := context.WithCancel(ctx)
	defer stopFeeding()
	specs := feed(feedCtx, f)
	published := make(chan struct{})
	go func() {
		defer close(published)
		pb.publishAll(ctx, specs, 8)
	}()

	var restarts []serverRestart
	var runErr error
	if runErr = pause(ctx, steady); runErr == nil {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			env.log.Debug("stopping the NATS server", "signal", sig)
			halted := time.Now()
			if runErr = f.nats.halt(sig); runErr != nil {
				break
			}
			if runErr = pause(ctx, downFor-time.Since(halted)); runErr != nil {
				break
			}
			readyAt, err := f.nats.start(ctx)
			if err != nil {
				runErr = fmt.Errorf("restart the NATS server: %w", err)
				break
			}
			env.log.Debug("NATS server back", "signal", sig, "down", readyAt.Sub(halted).Round(time.Millisecond))
			restarts = append(restarts, serverRestart{sig: sig, halted: halted, readyAt: readyAt})
			if runErr = pause(ctx, steady); runErr != nil {
				break
			}
		}
	}
	stopFeeding()
	<-published
	if runErr != nil {
		return runErr
	}
	to, stopped, err := stopSchedulers(f)
	if err != nil {
		return err
	}
	for _, n := range f.settle(ctx, 0, 90*time.Second) {
		r.note("%s", n)
	}
	snap, err := f.snapshot(ctx)
	if err != nil {
		return err
	}
	jobs := snap.tallyJobs(pb.published(), f.finalProcesses())
	fires := snap.tallyFires(ids, from, to, faultsFrom, stopped)
	jobs.apply(r)
	fires.apply(r)
	r.published = jobs.published + fires.pairs
	r.runOnce, r.runTwice = jobs.runOnce+fires.once, jobs.runTwice+fires.twice
	r.note("%d jobs and %d scheduled fires", jobs.published, fires.pairs)
	for _, rs := range restarts {
		fire, job := snap.firstAfter(rs.readyAt)
		name := map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[rs.sig]
		r.note("%s: down %.1fs, fires resumed %s after, jobs %s after", name, rs.readyAt.Sub(rs.halted).Seconds(),
			seconds(fire), seconds(job))
		if fire < 0 || fire > resumeTarget {
			r.fail("after the %s restart fires resumed %s after the server accepted connections (target %s)",
				name, seconds(fire), resumeTarget)
		}
	}
	if u := pb.notAcknowledged(); u > 0 {
		r.note("%d publishes never acknowledged (not counted)", u)
	}
	snap.historyVsExecutions(r)
	snap.repeatedTerminalEvents(r)
	snap.concurrency(r)
	return nil
}

// feed publishes jobs of kind work so that queue default keeps about
// backlog jobs pending, until ctx ends; then it closes the channel.
func feed(ctx context.Context, f *fleet) <-chan jobSpec {
	specs := make(chan jobSpec)
	go func() {
		defer close(specs)
		n := 0
		for ctx.Err() == nil {
			want := 0
			infoCtx, cancel := context.WithTimeout(ctx, time.Second)
			if cons, err := f.js.Consumer(infoCtx, protocol.StreamJobs, protocol.QueueConsumer(queueDefault)); err == nil {
				if info, err := cons.Info(infoCtx); err == nil && info.NumPending < backlog {
					want = backlog - int(info.NumPending)
				}
			}
			cancel()
			for range want {
				spec := jobSpec{subject: protocol.JobSubject(queueDefault, kindWork), id: fmt.Sprintf("work-%06d", n)}
				select {
				case <-ctx.Done():
					return
				case specs <- spec:
					n++
				}
			}
			_ = pause(ctx, 200*time.Millisecond)
		}
	}()
	return specs
}

// firstAfter is the time from t to the first `fired` event and to the
// first `succeeded` job event decided and stored after t (-1: none). An
// event its service decided before t (its time field) and sent only once
// the server was back is no sign of work resumed.
func (s *snapshot) firstAfter(t time.Time) (fire, job time.Duration) {
	fire, job = -1, -1
	after := func(decided, stored time.Time, best time.Duration) bool {
		return !decided.Before(t) && !stored.Before(t) && (best < 0 || stored.Sub(t) < best)
	}
	for _, se := range s.scheduleEvents {
		if se.ev.GetType() == protocol.EventFired && after(se.ev.GetTime().AsTime(), se.stored, fire) {
			fire = se.stored.Sub(t)
		}
	}
	for _, je := range s.jobEvents {
		if je.ev.GetType() == protocol.EventSucceeded && after(je.ev.GetTime().AsTime(), je.stored, job) {
			job = je.stored.Sub(t)
		}
	}
	return fire, job
}

func seconds(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}
