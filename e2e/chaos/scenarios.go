package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jetfleet/jetfleet/pkg/scheduler"
)

// runEnv is what every scenario gets besides its stack.
type runEnv struct {
	short     bool
	log       *slog.Logger
	rng       *rand.Rand
	rec       *recorder
	rate      int
	schedules []string
	// schedulesFrom is when every schedule existed: fires are counted from
	// the second after.
	schedulesFrom time.Time
}

func (e *runEnv) duration(full, short time.Duration) time.Duration {
	if e.short {
		return short
	}
	return full
}

// leaseTTL is topology.lease_ttl of the compose stack (config/compose).
const leaseTTL = 5 * time.Second

// loadRun is one scenario's load: what it published and when it ran.
type loadRun struct {
	loader   *loader
	from, to time.Time
	// events is what the scheduler said of the window's nominal times.
	events scheduleEvents
}

// underLoad publishes jobs at the run's rate while fault runs, then waits
// until every acknowledged job and every fire of the window has run (or
// settle passes) and fills the row's counts.
func (e *runEnv) underLoad(ctx context.Context, s *stack, r *row, name string, fault func(ctx context.Context) error) (*loadRun, error) {
	l := newLoader(s.js, name, e.rate)
	loadCtx, stopLoad := context.WithCancel(ctx)
	done := make(chan struct{})
	lr := &loadRun{loader: l, from: time.Now()}
	go func() { l.run(loadCtx); close(done) }()
	err := fault(ctx)
	stopLoad()
	<-done
	lr.to = time.Now()
	if err != nil {
		return lr, err
	}
	from := lr.from.Truncate(time.Second).Add(time.Second)
	if from.Before(e.schedulesFrom) {
		from = e.schedulesFrom
	}
	to := lr.to.Truncate(time.Second)
	e.settle(ctx, l, from, to)
	elapsed := lr.to.Sub(lr.from).Seconds()
	published := l.published()
	r.jobs = tallyJobs(published, e.rec)
	r.fires = tallyFires(e.schedules, from, to, e.rec.snapshot())
	// Read once the cluster answers again: right after a fault, a stream may
	// still be electing its leader, or the harness reconnecting.
	for attempt := 1; ; attempt++ {
		if lr.events, err = readScheduleEvents(ctx, s.js, e.schedules, from, to); err == nil {
			break
		}
		if attempt == 30 || sleep(ctx, 2*time.Second) != nil {
			return lr, err
		}
		e.log.Debug("schedule events not read yet", "error", err)
	}
	if n := len(lr.events.missed); n > 0 {
		// Every nominal time of the window must run: a missed event is a
		// missed fire, or a false one if the fire ran after all.
		r.fail("the scheduler declared %d nominal times missed (%s)", n, strings.Join(lr.events.missed[:min(n, 5)], ", "))
	}
	r.load = fmt.Sprintf("%d jobs/s (%.0f/s acked) + %d schedules every 1 s, %.0f s", e.rate, float64(len(published))/elapsed, len(e.schedules), elapsed)
	if n := l.notAcknowledged(); n > 0 {
		r.note("%d publishes never acknowledged within %s (not counted as published)", n, giveUp)
	}
	if r.jobs.twice > 0 {
		r.note("run twice: %s…", strings.Join(r.jobs.twiceIDs, " "))
	}
	if r.fires.redelivered > 0 {
		r.note("%d fires ran twice from one job message (a redelivery, at-least-once)", r.fires.redelivered)
	}
	// Below half the rate the scenario did not test what it says. Power
	// loss is exempt: its outage is the fault, no publish can succeed then.
	if acked := float64(len(published)) / elapsed; acked < float64(e.rate)/2 && !strings.HasPrefix(name, "power-") {
		r.fail("load not held: %.0f jobs/s acknowledged of %d offered", acked, e.rate)
	}
	r.checkNoLoss()
	return lr, nil
}

// settle waits until every acknowledged job and every fire of [from, to]
// has run: as long as the count of those still to run keeps falling (a
// backlog drains), at most settleLimit; a minute without progress ends it.
func (e *runEnv) settle(ctx context.Context, l *loader, from, to time.Time) {
	const settleLimit, noProgress = 10 * time.Minute, time.Minute
	deadline := time.Now().Add(settleLimit)
	best, lastProgress := -1, time.Now()
	for time.Now().Before(deadline) && time.Since(lastProgress) < noProgress && ctx.Err() == nil {
		jobs := tallyJobs(l.published(), e.rec)
		fires := tallyFires(e.schedules, from, to, e.rec.snapshot())
		left := jobs.lost + fires.missed
		if left == 0 {
			return
		}
		if best < 0 || left < best {
			best, lastProgress = left, time.Now()
		}
		e.log.Debug("settling", "jobs not run", jobs.lost, "fires not run", fires.missed)
		_ = sleep(ctx, time.Second)
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// between is a random duration in [lo, hi).
func (e *runEnv) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(e.rng.Int64N(int64(hi-lo)))
}

// Scenario node-kills: docker kill of a random NATS node every 10-30 s,
// started again 5 s later, under the steady load.
func runNodeKills(ctx context.Context, e *runEnv, s *stack, r *row) error {
	var kills []time.Time
	var killed []string
	lr, err := e.underLoad(ctx, s, r, "kills", func(ctx context.Context) error {
		end := time.Now().Add(e.duration(10*time.Minute, 3*time.Minute))
		if err := sleep(ctx, 10*time.Second); err != nil { // the pre-fault rate
			return err
		}
		for time.Now().Add(20 * time.Second).Before(end) {
			node := natsNodes[e.rng.IntN(len(natsNodes))]
			e.log.Info("docker kill", "node", node)
			kills = append(kills, time.Now())
			killed = append(killed, node)
			if err := docker(ctx, "kill", s.containers[node]); err != nil {
				return err
			}
			if err := sleep(ctx, 5*time.Second); err != nil {
				return err
			}
			if err := docker(ctx, "start", s.containers[node]); err != nil {
				return err
			}
			if err := sleep(ctx, e.between(10*time.Second, 30*time.Second)-5*time.Second); err != nil {
				return err
			}
		}
		return sleep(ctx, time.Until(end))
	})
	if err != nil {
		return err
	}
	r.faults = fmt.Sprintf("%d kills (%s), each node started 5 s later", len(kills), strings.Join(killed, " "))
	published, execs := lr.loader.published(), e.rec.snapshot()
	preFault := 0
	if len(kills) > 0 {
		preFault = effectRate(published, execs, lr.from.Add(3*time.Second), kills[0])
	}
	took := recoveries(kills, published, execs, preFault, 30*time.Second)
	worst, slow := time.Duration(0), 0
	for _, d := range took {
		if d < 0 || d > 30*time.Second {
			slow++
		}
		worst = max(worst, d)
	}
	r.recover = fmt.Sprintf("≥90%% of the pre-fault %d jobs/s within %.0f s of each kill", preFault, worst.Seconds())
	if slow > 0 {
		r.recover = fmt.Sprintf("%d of %d kills not back to 90%% of %d jobs/s within 30 s", slow, len(kills), preFault)
		r.fail("throughput not back to 90%% of the pre-fault %d jobs/s within 30 s after %d of %d kills (%v)", preFault, slow, len(kills), took)
	}
	return nil
}

// Scenario power-loss: every NATS container killed at once, started again
// 5 s later.
func runPowerLoss(interval syncSetting) func(ctx context.Context, e *runEnv, s *stack, r *row) error {
	return func(ctx context.Context, e *runEnv, s *stack, r *row) error {
		var back time.Duration
		_, err := e.underLoad(ctx, s, r, "power-"+string(interval), func(ctx context.Context) error {
			if err := sleep(ctx, e.duration(20*time.Second, 8*time.Second)); err != nil {
				return err
			}
			e.log.Info("docker kill of every NATS node at once")
			var wg sync.WaitGroup
			errs := make([]error, len(natsNodes))
			killed := time.Now()
			for i, node := range natsNodes {
				wg.Go(func() { errs[i] = docker(ctx, "kill", s.containers[node]) })
			}
			wg.Wait()
			if err := joinErrs(errs); err != nil {
				return err
			}
			if err := sleep(ctx, 5*time.Second); err != nil {
				return err
			}
			for i, node := range natsNodes {
				errs[i] = docker(ctx, "start", s.containers[node])
			}
			if err := joinErrs(errs); err != nil {
				return err
			}
			if err := s.awaitHealthy(ctx, 3*time.Minute); err != nil {
				return err
			}
			back = time.Since(killed)
			return sleep(ctx, e.duration(30*time.Second, 12*time.Second))
		})
		if err != nil {
			return err
		}
		r.faults = fmt.Sprintf("all 3 nodes killed at once, started 5 s later (sync_interval: %s)", interval)
		r.recover = fmt.Sprintf("stack healthy %.0f s after the kill", back.Seconds())
		if interval == syncDefault {
			// The documented consequence of the setting: reported, not judged.
			r.failures = nil
			r.note("default sync interval: reported, not judged")
		}
		return nil
	}
}

// Scenario partition: the NATS node the scheduler leader is connected to
// is cut off the network for 30 s; then the scheduler leader itself.
func runPartition(ctx context.Context, e *runEnv, s *stack, r *row) error {
	tl := startLeaderTimeline(ctx, e, s)
	var cuts []partitionCut
	lr, err := e.underLoad(ctx, s, r, "partition", func(ctx context.Context) error {
		if err := sleep(ctx, e.duration(10*time.Second, 5*time.Second)); err != nil {
			return err
		}
		leader, err := s.leader(ctx, "scheduler", 30*time.Second, "scheduler-1", "scheduler-2")
		if err != nil {
			return err
		}
		node, err := s.nodeOf(ctx, leader)
		if err != nil {
			return err
		}
		var led []string
		for _, stream := range firePath {
			at, err := s.streamLeader(ctx, stream)
			if err != nil {
				return err
			}
			if at == serverName(node) {
				led = append(led, stream)
			}
		}
		cuts = append(cuts, partitionCut{at: time.Now(), what: fmt.Sprintf("%s (of leader %s) cut off 30 s", node, leader), led: led})
		if err := s.cutOff(ctx, node, 30*time.Second); err != nil {
			return err
		}
		cuts[len(cuts)-1].healed = time.Now()
		if err := s.awaitHealthy(ctx, 2*time.Minute); err != nil {
			return err
		}
		if err := sleep(ctx, e.duration(15*time.Second, 5*time.Second)); err != nil {
			return err
		}
		leader, err = s.leader(ctx, "scheduler", 30*time.Second, "scheduler-1", "scheduler-2")
		if err != nil {
			return err
		}
		cuts = append(cuts, partitionCut{at: time.Now(), what: fmt.Sprintf("leader %s cut off 30 s", leader)})
		if err := s.cutOff(ctx, leader, 30*time.Second); err != nil {
			return err
		}
		cuts[len(cuts)-1].healed = time.Now()
		if err := s.awaitHealthy(ctx, 2*time.Minute); err != nil {
			return err
		}
		return sleep(ctx, e.duration(15*time.Second, 5*time.Second))
	})
	tl.stop()
	if err != nil {
		return err
	}
	var faults, waits []string
	for i, c := range cuts {
		faults = append(faults, c.what)
		end := lr.to
		if i+1 < len(cuts) {
			end = cuts[i+1].at
		}
		// Fires resume when the scheduler has them stored again: the time
		// in each fired event, read back from EVENTS, which the scheduler
		// sets once JetStream has stored the job. The effect comes later by
		// the job's trip through JOBS and an agent, which the cut also
		// delays (an agent on the cut node reconnects; a stream led from
		// there elects a new leader).
		wait, at := lr.events.latestFire(c.at, c.healed)
		if at.IsZero() {
			// Schedules fire every second: no fired event read back for a
			// cut means the read failed, not that nothing was late.
			r.fail("%s: no fired event of the cut's window was read back from EVENTS", c.what)
		}
		// The scheduler leader keeps the streams it fires through led
		// from other nodes than its own (replica.LeadersElsewhere), so the
		// cut of its node costs no election on the fire path. It cannot
		// move them in its first half lease TTL on a server, nor while a
		// node that just came back takes a stream's lead: if the cut node
		// led one at the cut all the same, that stream has no leader until
		// NATS elects one (≤ 9 s after the old one's last heartbeat); then
		// a lease write is sent again a renewal interval after, a fire a
		// resend_after, and a new leader loads the schedules first.
		limit, why := leaseTTL+2*time.Second, "lease TTL + 2 s"
		if len(c.led) > 0 {
			limit = raftElectionMax + leaseTTL/4 + 3*time.Second
			why = fmt.Sprintf("the cut node led %s at the cut: its election (≤ %s) + a renewal interval (%s) + 3 s",
				strings.Join(c.led, " "), raftElectionMax, leaseTTL/4)
		}
		waits = append(waits, fmt.Sprintf("%s: fires decided ≤ %.1f s late while cut (%s; target %s)", c.what, wait.Seconds(), at.UTC().Format("15:04:05"), why))
		if wait > limit {
			r.fail("%s: a fire was decided %.1f s after its nominal time, more than %s (%s)", c.what, wait.Seconds(), why, limit)
		}
		// After the heal, reported: a node that returns from a partition
		// may depose the leaders of its streams (its term grew while it
		// was alone), and the lease bucket is then without a leader for an
		// election; no replica can renew or take the lease meanwhile.
		wait, at = lr.events.latestFire(c.healed, end)
		waits = append(waits, fmt.Sprintf("≤ %.1f s after the heal (%s)", wait.Seconds(), at.UTC().Format("15:04:05")))
	}
	r.faults = strings.Join(faults, "; ")
	r.note("scheduler leaders: %s", tl.String())
	r.recover = fmt.Sprintf("%s; longest wait of a fire's run: %.1f s (%s)", strings.Join(waits, "; "), r.fires.latest.Seconds(), r.fires.latestAt.UTC().Format("15:04:05"))
	return nil
}

// partitionCut is one cut of the partition scenario; led says which
// streams of the fire path the cut node led at the time.
type partitionCut struct {
	at, healed time.Time
	what       string
	led        []string // the streams of firePath the cut node led
}

// firePath are the streams a fire needs before its job is stored and its
// events written: the lease that entitles the leader, the schedules'
// state, the job's stream, EVENTS.
var firePath = scheduler.FirePath

// raftElectionMax is nats-server's longest election timeout (raft.go,
// maxElectionTimeoutDefault, not configurable): a stream whose leader is
// cut off has a new one at most this long after its last heartbeat.
const raftElectionMax = 9 * time.Second

// Scenario pauses: docker pause of the scheduler leader, of the supervisor
// and of an agent, 15 s each.
func runPauses(ctx context.Context, e *runEnv, s *stack, r *row) error {
	tl := startLeaderTimeline(ctx, e, s)
	var faults []string
	var pauses []time.Time
	lr, err := e.underLoad(ctx, s, r, "pauses", func(ctx context.Context) error {
		if err := sleep(ctx, e.duration(10*time.Second, 5*time.Second)); err != nil {
			return err
		}
		leader, err := s.leader(ctx, "scheduler", 30*time.Second, "scheduler-1", "scheduler-2")
		if err != nil {
			return err
		}
		for _, svc := range []string{leader, "supervisor", "agent-1"} {
			faults = append(faults, svc)
			pauses = append(pauses, time.Now())
			e.log.Info("docker pause", "service", svc)
			if err := docker(ctx, "pause", s.containers[svc]); err != nil {
				return err
			}
			if err := sleep(ctx, 15*time.Second); err != nil {
				return err
			}
			if err := docker(ctx, "unpause", s.containers[svc]); err != nil {
				return err
			}
			if err := sleep(ctx, e.duration(20*time.Second, 5*time.Second)); err != nil {
				return err
			}
		}
		return nil
	})
	tl.stop()
	if err != nil {
		return err
	}
	r.faults = "docker pause 15 s: " + strings.Join(faults, ", ")
	r.note("scheduler leaders: %s", tl.String())
	// Each pause's own figures: from its start to the next one's (or the
	// end), the longest wait of a fire and the jobs that ran a second time.
	var each []string
	for i, start := range pauses {
		end := lr.to
		if i+1 < len(pauses) {
			end = pauses[i+1]
		}
		wait, _ := lr.events.latestFire(start, end)
		each = append(each, fmt.Sprintf("%s: fire decided ≤ %.1f s late, %d jobs ran again", faults[i], wait.Seconds(), ranAgainIn(e.rec.snapshot(), start, end)))
	}
	r.recover = fmt.Sprintf("longest wait of a fire: %.1f s (run); %s", r.fires.latest.Seconds(), strings.Join(each, "; "))
	return nil
}

// ranAgainIn counts the jobs whose second execution began in [from, to).
func ranAgainIn(execs []execution, from, to time.Time) int {
	seen, n := map[string]int{}, 0
	for _, x := range execs {
		seen[x.jobID]++
		if seen[x.jobID] == 2 && !x.at.Before(from) && x.at.Before(to) {
			n++
		}
	}
	return n
}

// leaderTimeline records who held the scheduler lease when.
type leaderTimeline struct {
	mu      sync.Mutex
	changes []string
	cancel  context.CancelFunc
	done    chan struct{}
}

func startLeaderTimeline(ctx context.Context, e *runEnv, s *stack) *leaderTimeline {
	ctx, cancel := context.WithCancel(ctx)
	tl := &leaderTimeline{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tl.done)
		start, last := time.Now(), "?"
		names := map[string]string{}
		for ctx.Err() == nil {
			opCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
			holder, err := s.leaseHolder(opCtx, "scheduler")
			cancel()
			if err == nil {
				if _, ok := names[holder]; !ok && holder != "" {
					if m, err := s.holders(ctx, "scheduler-1", "scheduler-2"); err == nil {
						names = m
					}
				}
				who := names[holder]
				switch {
				case holder == "":
					who = "none"
				case who == "":
					who = holder
				}
				if who != last {
					tl.mu.Lock()
					tl.changes = append(tl.changes, fmt.Sprintf("%s from %.0f s", who, time.Since(start).Seconds()))
					tl.mu.Unlock()
					last = who
				}
			}
			_ = sleep(ctx, 250*time.Millisecond)
		}
	}()
	return tl
}

func (tl *leaderTimeline) stop() { tl.cancel(); <-tl.done }

func (tl *leaderTimeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return strings.Join(tl.changes, ", ")
}

// nodeOf is the NATS node service svc is connected to, from the nodes'
// connection lists (monitoring port). A node may still list a connection
// its client has left (a client that stops hearing its server moves on;
// the server notices minutes later): of the nodes that list svc, the one
// with its newest connection is where it is now.
func (s *stack) nodeOf(ctx context.Context, svc string) (string, error) {
	ip, err := s.containerIP(ctx, svc)
	if err != nil {
		return "", err
	}
	var at string
	var newest time.Time
	for _, node := range natsNodes {
		out, err := s.compose(ctx, "port", node, "8222")
		if err != nil {
			return "", fmt.Errorf("docker-compose port %s 8222: %w", node, err)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+strings.TrimSpace(string(out))+"/connz?limit=4096", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		var connz struct {
			Connections []struct {
				IP    string    `json:"ip"`
				Start time.Time `json:"start"`
			} `json:"connections"`
		}
		err = json.NewDecoder(resp.Body).Decode(&connz)
		_ = resp.Body.Close()
		if err != nil {
			return "", fmt.Errorf("%s /connz: %w", node, err)
		}
		for _, c := range connz.Connections {
			if c.IP == ip && c.Start.After(newest) {
				at, newest = node, c.Start
			}
		}
	}
	if at == "" {
		return "", fmt.Errorf("%s (%s) is connected to no NATS node", svc, ip)
	}
	return at, nil
}

func (s *stack) containerIP(ctx context.Context, svc string) (string, error) {
	out, err := execOutput(ctx, "docker", "inspect", "--format",
		fmt.Sprintf(`{{(index .NetworkSettings.Networks %q).IPAddress}}`, s.network()), s.containers[svc])
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// cutOff disconnects svc's container from the stack's network for d, then
// connects it again under its service name.
func (s *stack) cutOff(ctx context.Context, svc string, d time.Duration) error {
	if err := docker(ctx, "network", "disconnect", s.network(), s.containers[svc]); err != nil {
		return err
	}
	if err := sleep(ctx, d); err != nil {
		return err
	}
	return docker(ctx, "network", "connect", "--alias", svc, s.network(), s.containers[svc])
}

// Scenario clock-skew: scheduler-1's schedule clock 30 s ahead,
// scheduler-2's 30 s behind (scheduler.test_clock_offset); leadership is
// moved between them twice by docker kill of the leader.
func runClockSkew(ctx context.Context, e *runEnv, s *stack, r *row) error {
	if err := s.skew(ctx, "30s", "-30s"); err != nil {
		return err
	}
	tl := startLeaderTimeline(ctx, e, s)
	var faults []string
	lr, err := e.underLoad(ctx, s, r, "skew", func(ctx context.Context) error {
		for range 2 {
			if err := sleep(ctx, e.duration(30*time.Second, 15*time.Second)); err != nil {
				return err
			}
			leader, err := s.leader(ctx, "scheduler", 30*time.Second, "scheduler-1", "scheduler-2")
			if err != nil {
				return err
			}
			faults = append(faults, "kill "+leader)
			if err := docker(ctx, "kill", s.containers[leader]); err != nil {
				return err
			}
			if err := sleep(ctx, 5*time.Second); err != nil {
				return err
			}
			if err := docker(ctx, "start", s.containers[leader]); err != nil {
				return err
			}
		}
		return sleep(ctx, e.duration(30*time.Second, 15*time.Second))
	})
	tl.stop()
	// The clocks stay skewed: this is the stack's last scenario (main.go).
	if err != nil {
		return err
	}
	r.faults = "scheduler-1 +30 s, scheduler-2 −30 s; " + strings.Join(faults, ", ")
	r.note("scheduler leaders: %s", tl.String())
	early := time.Duration(0)
	for _, x := range e.rec.snapshot() {
		if x.scheduleID != "" && x.at.After(lr.from) {
			early = max(early, time.Unix(x.nominal, 0).Sub(x.at))
		}
	}
	r.recover = fmt.Sprintf("longest wait of a fire %.0f s; earliest fire %.0f s before its time", r.fires.latest.Seconds(), early.Seconds())
	return nil
}

// skew recreates the scheduler containers with their clocks moved.
func (s *stack) skew(ctx context.Context, one, two string) error {
	s.env = append(s.env, "CHAOS_SKEW_1="+one, "CHAOS_SKEW_2="+two) // the last one wins
	if out, err := s.compose(ctx, "up", "--detach", "--no-build", "--no-deps", "scheduler-1", "scheduler-2"); err != nil {
		return fmt.Errorf("docker-compose up (clock offsets %s, %s): %w\n%s", one, two, err, out)
	}
	for _, svc := range []string{"scheduler-1", "scheduler-2"} {
		out, err := s.compose(ctx, "ps", "--quiet", svc)
		if err != nil {
			return fmt.Errorf("docker-compose ps %s: %w: %s", svc, err, out)
		}
		s.containers[svc] = strings.TrimSpace(string(out))
	}
	return s.awaitHealthy(ctx, 2*time.Minute)
}
