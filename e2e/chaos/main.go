package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// scenario is one row of the table.
type scenario struct {
	name  string
	about string
	run   func(ctx context.Context, e *runEnv, s *stack, r *row) error
}

// The scenarios on the stack whose servers sync every write, in this
// order (one stack for all, to keep the run short; each counts only its
// own jobs and the fires of its own window); power loss with the default
// interval gets a stack of its own.
var scenarios = []scenario{
	{"node-kills", "docker kill of a random NATS node every 10-30 s, started 5 s later", runNodeKills},
	{"partition", "the scheduler leader's NATS node cut off 30 s; then the leader itself", runPartition},
	{"pauses", "docker pause 15 s of the scheduler leader, the supervisor, an agent", runPauses},
	{"permissions", "every NATS user against what it must not do and what it needs, on the cluster", runPermissions},
	{"power-loss", "every NATS node killed at once (sync_interval: always)", runPowerLoss(syncAlways)},
	// Last: it leaves the schedulers' clocks skewed.
	{"clock-skew", "one scheduler replica's clock 30 s ahead, the other's 30 s behind; leadership moved twice", runClockSkew},
}

var defaultIntervalScenario = scenario{"power-loss-default", "every NATS node killed at once (default sync interval)", runPowerLoss(syncDefault)}

func main() { os.Exit(run()) }

func run() int {
	short := flag.Bool("short", false, "CI's run: node kills for 3 minutes, shorter phases, no default-interval stack")
	only := flag.String("scenario", "", "comma-separated scenarios to run (default: all): "+names())
	keep := flag.Bool("keep", false, "keep the run's configuration directory, with every container's log (logs.txt)")
	skipImages := flag.Bool("skip-images", false, "use the images as they are (go tool task images not run)")
	rate := flag.Int("rate", 150, "jobs published per second (the issue's 500 with 200 schedules is more than a 2-core machine runs through this stack: docs/reliability.md)")
	schedules := flag.Int("schedules", 100, "schedules firing every second")
	seed := flag.Uint64("seed", 0, "seed of the random choices (default: from the clock; printed)")
	verbose := flag.Bool("v", false, "log progress of every fault")
	flag.Parse()

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	selected, withDefault, err := selectScenarios(*only, *short)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	root, err := repoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	started := time.Now()
	fmt.Printf("jetfleet chaos run (seed %d, short %v): %d jobs/s, %d one-second schedules, 3 NATS nodes, R3\n",
		*seed, *short, *rate, *schedules)
	if !*skipImages {
		cmd := exec.CommandContext(ctx, "go", "tool", "task", "images")
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: go tool task images:", err)
			return 1
		}
	}
	rec, err := startRecorder()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 1
	}
	defer rec.close()
	env := &runEnv{short: *short, log: log, rng: rand.New(rand.NewPCG(*seed, 21)), rec: rec, rate: *rate}

	var rows []*row
	if len(selected) > 0 {
		rows = append(rows, runStack(ctx, root, env, syncAlways, selected, *schedules, *keep)...)
	}
	if withDefault {
		rows = append(rows, runStack(ctx, root, env, syncDefault, []scenario{defaultIntervalScenario}, *schedules, *keep)...)
	}
	printTable(os.Stdout, rows)
	failed := 0
	for _, r := range rows {
		if r.err != nil || len(r.failures) > 0 {
			failed++
		}
	}
	fmt.Printf("\n%d scenarios, %d failed, in %s\n", len(rows), failed, time.Since(started).Round(time.Second))
	if failed > 0 {
		return 1
	}
	return 0
}

// runStack brings up one stack, adds the schedules and runs the scenarios
// on it one after the other.
func runStack(ctx context.Context, root string, env *runEnv, sync syncSetting, list []scenario, schedules int, keep bool) []*row {
	rows := make([]*row, len(list))
	for i, sc := range list {
		rows[i] = &row{scenario: sc.name}
	}
	fail := func(err error) []*row {
		for _, r := range rows {
			if r.err == nil && r.load == "" {
				r.err = err
			}
		}
		return rows
	}
	step := time.Now()
	s, err := startStack(ctx, root, sync, env.rec.url)
	defer func() {
		if s != nil {
			s.down(keep)
		}
	}()
	if err != nil {
		if s != nil && s.project != "" {
			fmt.Fprintln(os.Stderr, s.logs(context.Background(), 40))
		}
		return fail(fmt.Errorf("stack: %w", err))
	}
	env.log.Info("stack up", "project", s.project, "sync_interval", sync, "took", time.Since(step).Round(time.Second))
	env.schedules, err = addSchedules(ctx, s.nc, "tick-"+string(sync), schedules)
	if err != nil {
		return fail(fmt.Errorf("schedules: %w", err))
	}
	env.schedulesFrom = time.Now().Truncate(time.Second).Add(2 * time.Second)
	for i, sc := range list {
		step := time.Now()
		env.log.Info("scenario", "name", sc.name, "about", sc.about)
		if err := sc.run(ctx, env, s, rows[i]); err != nil {
			rows[i].err = err
			fmt.Fprintf(os.Stderr, "chaos: %s: %v\nlogs:\n%s\n", sc.name, err, s.logs(context.Background(), 30))
		}
		env.log.Info("scenario done", "name", sc.name, "took", time.Since(step).Round(time.Second), "failures", len(rows[i].failures))
		for _, f := range rows[i].failures {
			env.log.Warn("target missed", "scenario", sc.name, "failure", f)
		}
		if len(rows[i].failures) > 0 {
			fmt.Fprintf(os.Stderr, "chaos: %s missed a target; the services' last log lines:\n%s\n", sc.name, s.logs(context.Background(), 60))
		}
		if ctx.Err() != nil {
			for _, r := range rows[i+1:] {
				r.err = fmt.Errorf("not run: %w", context.Cause(ctx))
			}
			break
		}
	}
	return rows
}

func names() string {
	var n []string
	for _, s := range append(slices.Clone(scenarios), defaultIntervalScenario) {
		n = append(n, s.name)
	}
	return strings.Join(n, ", ")
}

// selectScenarios picks the scenarios of -scenario (all by default; the
// default-interval stack only in the full run unless named).
func selectScenarios(only string, short bool) ([]scenario, bool, error) {
	if only == "" {
		return scenarios, !short, nil
	}
	chosen := map[string]bool{}
	withDefault := false
	for _, name := range strings.Split(only, ",") {
		name = strings.TrimSpace(name)
		if name == defaultIntervalScenario.name {
			withDefault = true
			continue
		}
		if !slices.ContainsFunc(scenarios, func(s scenario) bool { return s.name == name }) {
			return nil, false, fmt.Errorf("-scenario: no scenario %q (there are: %s)", name, names())
		}
		chosen[name] = true
	}
	// In the list's order, whatever the flag's: clock-skew stays last.
	var out []scenario
	for _, sc := range scenarios {
		if chosen[sc.name] {
			out = append(out, sc)
		}
	}
	return out, withDefault, nil
}

func printTable(w *os.File, rows []*row) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tload held\tfaults injected\tjobs published\trun once\trun twice\tlost\tduplicate fires\tmissed fires\ttime to recover\tresult")
	for _, r := range rows {
		result := "ok"
		switch {
		case r.err != nil:
			result = "ERROR"
		case len(r.failures) > 0:
			result = "FAIL"
		}
		counts := fmt.Sprintf("%d\t%d\t%d\t%d\t%d\t%d", r.jobs.published, r.jobs.once, r.jobs.twice, r.jobs.lost, r.fires.duplicate, r.fires.missed)
		if r.load == "-" { // no load: the permissions matrix
			counts = "-\t-\t-\t-\t-\t-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.scenario, r.load, r.faults, counts, r.recover, result)
	}
	_ = tw.Flush()
	for _, r := range rows {
		for _, n := range r.notes {
			fmt.Fprintf(w, "  %s: %s\n", r.scenario, n)
		}
		for _, f := range r.failures {
			fmt.Fprintf(w, "  %s: FAIL: %s\n", r.scenario, f)
		}
		if r.err != nil {
			fmt.Fprintf(w, "  %s: ERROR: %v\n", r.scenario, r.err)
		}
	}
}

// repoRoot is the repository's root: the directory of go.work above here.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the jetfleet repository (no go.work above the working directory)")
		}
		dir = parent
	}
}

func joinErrs(errs []error) error { return errors.Join(errs...) }

func execOutput(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
