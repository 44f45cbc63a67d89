package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/service"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// figFailover is the failover figure; its target depends on the lease TTL.
func figFailover(leaseTTL time.Duration) figureSpec {
	return figureSpec{name: "failover_next_fire", label: fmt.Sprintf("kill leader → next fire (lease TTL %s)", leaseTTL),
		unit: UnitS, target: &Target{Value: (leaseTTL + time.Second).Seconds()}}
}

// failover runs Replicas scheduler replicas with a schedule firing every
// second, kills the leader (its connection closes, it never stops) just
// after a fire, and measures the time from the kill until the next fire,
// which only a new leader can publish.
func (b *bencher) failover(ctx context.Context, run int) error {
	ttl := b.cfg.LeaseTTL
	rs, err := b.open(ctx, serverOptions{ownFleet: true, topology: topology.Config{LeaseTTL: ttl}})
	if err != nil {
		return err
	}
	defer rs.close(ctx)
	ctx, cancel := context.WithTimeout(ctx, time.Minute+3*ttl)
	defer cancel()

	replicas := make([]*scheduler.Scheduler, b.cfg.Replicas)
	envs := make([]*service.Env, b.cfg.Replicas)
	for i := range replicas {
		if envs[i], err = rs.connect(fmt.Sprintf("scheduler-%d", i)); err != nil {
			return err
		}
		if replicas[i], err = scheduler.New(scheduler.Config{}, envs[i], clock.Real()); err != nil {
			return err
		}
		if err := replicas[i].Start(ctx); err != nil {
			return err
		}
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, r := range replicas {
			_ = r.Stop(stopCtx)
		}
	}()
	leader, err := waitAnyLeader(ctx, replicas)
	if err != nil {
		return err
	}

	writer, err := rs.connect("writer")
	if err != nil {
		return err
	}
	queue := rs.queue("failover")
	fires, err := CollectFires(ctx, writer.JetStream, rs.topo, queue)
	if err != nil {
		return err
	}
	defer fires.Stop()
	if _, err := jetfleet.NewClient(writer.Conn).AddSchedule(ctx, &jetfleet.Schedule{ID: queue + "-tick",
		Spec:   jetfleet.Spec{Interval: &jetfleet.Interval{Every: jetfleet.Duration(time.Second)}},
		Target: jetfleet.Target{Queue: queue, Kind: kindTick}}); err != nil {
		return fmt.Errorf("add schedule: %w", err)
	}
	// Steady: two fires; then kill at the next one, a second before the one after.
	got, err := fires.Wait(ctx, 2)
	if err != nil {
		return err
	}
	got, err = fires.Wait(ctx, len(got)+1)
	if err != nil {
		return err
	}
	killed := time.Now()
	envs[leader].Conn.Close()
	last := got[len(got)-1].Nominal
	for _, f := range got {
		if f.Nominal.After(last) {
			last = f.Nominal
		}
	}
	for {
		got, err = fires.Wait(ctx, len(got)+1)
		if err != nil {
			return fmt.Errorf("no fire after the leader was killed: %w", err)
		}
		if f := got[len(got)-1]; f.Nominal.After(last) {
			d := f.Received.Sub(killed)
			b.record(ScenarioFailover, figFailover(ttl), d.Seconds())
			b.progress("failover run %d: next fire %s after the leader was killed (lease TTL %s)", run, d.Round(time.Millisecond), ttl)
			return nil
		}
	}
}

// waitAnyLeader waits until one replica leads and returns its index.
func waitAnyLeader(ctx context.Context, replicas []*scheduler.Scheduler) (int, error) {
	for {
		for i, r := range replicas {
			if r.IsLeader() {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no scheduler replica leads: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling the electors; no event marks it
		}
	}
}
