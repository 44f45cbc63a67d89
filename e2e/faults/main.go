package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// scenario is one fault scenario: it runs on a fleet of its own and fills
// its row.
type scenario struct {
	name  string
	about string
	size  fleetSize
	run   func(ctx context.Context, env *runEnv, f *fleet, r *row) error
}

var scenarios = []scenario{
	{"bad-input", "malformed subjects, headers and payloads on jobs.>", defaultSize, runBadInput},
	{"unknown-burst", "a burst of jobs of a kind no agent runs", defaultSize, runUnknownBurst},
	{"agents-killed", "kill -9 a random agent every few seconds under load", defaultSize, runAgentsKilled},
	{"scheduler-leader", "kill -9 and SIGSTOP the scheduler leader under 50 schedules", defaultSize, runSchedulerLeader},
	{"supervisor-killed", "poison jobs while the supervisor leader is killed twice", fleetSize{agents: 3, schedulers: 3, supervisors: 2}, runSupervisorKilled},
	{"nats-restart", "the NATS server stopped (SIGTERM, then SIGKILL) and restarted under jobs and schedules", defaultSize, runNATSRestart},
	{"two-queues", "agents serving two queues, jobs on one of them", fleetSize{agents: 3, schedulers: 3, supervisors: 1,
		queues: []string{queueDefault, queueOther}}, runTwoQueues},
}

// runEnv is what every scenario gets besides its fleet.
type runEnv struct {
	short bool
	log   *slog.Logger
	rng   *rand.Rand
}

// scale picks the full or the -short value.
func (e *runEnv) scale(full, short int) int {
	if e.short {
		return short
	}
	return full
}

func (e *runEnv) duration(full, short time.Duration) time.Duration {
	if e.short {
		return short
	}
	return full
}

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func main() { os.Exit(run()) }

func run() int {
	var names listFlag
	short := flag.Bool("short", false, "small sizes and short phases (what CI runs: 10-50s per scenario)")
	keep := flag.Bool("keep", false, "keep the run's directory: binaries, configurations, logs, effect files, the NATS store")
	verbose := flag.Bool("v", false, "log every fault (kill, stop, restart) and the outcome of every bad input")
	seed := flag.Uint64("seed", 0, "seed of the random choices (default: from the clock; printed)")
	flag.Var(&names, "scenario", "run only this `scenario` (repeatable, or a comma-separated list): "+scenarioNames())
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go tool task faults -- [flags]\n\n"+
			"Runs the jetfleet fleet as separate processes, injects faults and prints counts per scenario.\n"+
			"Exits 1 when a hard target fails (docs/reliability.md).\n\nscenarios:\n")
		for _, s := range scenarios {
			fmt.Fprintf(flag.CommandLine.Output(), "  %-18s %s\n", s.name, s.about)
		}
		fmt.Fprintf(flag.CommandLine.Output(), "\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "faults: unexpected argument %q\n", flag.Arg(0))
		return 2
	}
	selected, err := selectScenarios(names)
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		return 2
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	env := &runEnv{short: *short, log: log, rng: rand.New(rand.NewPCG(*seed, 0))}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C ends the harness at once (its processes die with it: Pdeathsig)
	}()

	root, err := repoRoot()
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		return 2
	}
	dir, err := os.MkdirTemp("", "jetfleet-faults-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		return 2
	}
	defer func() {
		if *keep {
			fmt.Fprintf(os.Stderr, "kept: %s\n", dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	}()
	log.Info("fault run", "short", *short, "seed", *seed, "scenarios", strings.Join(scenarioList(selected), ","), "dir", dir)
	bins, err := build(ctx, log, root, filepath.Join(dir, "bin"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "faults: %v\n", err)
		return 1
	}

	var rows []*row
	for _, s := range selected {
		if ctx.Err() != nil {
			break
		}
		r := runScenario(ctx, env, bins, filepath.Join(dir, s.name), s)
		rows = append(rows, r)
		log.Info("scenario done", "scenario", s.name, "passed", r.passed(), "took", r.elapsed.Round(time.Second))
	}
	fmt.Println()
	printTable(os.Stdout, rows)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "faults: interrupted")
		return 130
	}
	for _, r := range rows {
		if !r.passed() {
			if !*keep {
				fmt.Fprintln(os.Stderr, "faults: hard targets failed; run again with -keep to keep the logs")
			}
			return 1
		}
	}
	return 0
}

// runScenario runs one scenario on a fleet of its own, stopped (and its
// processes killed) whatever happens.
func runScenario(ctx context.Context, env *runEnv, bins binaries, dir string, s scenario) *row {
	start := time.Now()
	r := newRow(s.name)
	defer func() {
		r.elapsed = time.Since(start)
		r.judge()
	}()
	env.log.Info("scenario", "scenario", s.name, "about", s.about)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		r.err = err
		return r
	}
	f, err := startFleet(ctx, env.log.With("scenario", s.name), bins, dir, s.size)
	if err != nil {
		r.err = fmt.Errorf("start the fleet: %w", err)
		return r
	}
	defer f.close()
	if err := s.run(ctx, env, f, r); err != nil {
		r.err = err
	}
	return r
}

func selectScenarios(names []string) ([]scenario, error) {
	if len(names) == 0 {
		return scenarios, nil
	}
	var out []scenario
	for _, s := range scenarios { // in the table's order
		if slices.Contains(names, s.name) {
			out = append(out, s)
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(scenarios, func(s scenario) bool { return s.name == n }) {
			return nil, errors.New("unknown scenario " + n + "; known: " + scenarioNames())
		}
	}
	return out, nil
}

func scenarioList(ss []scenario) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.name)
	}
	return out
}

func scenarioNames() string { return strings.Join(scenarioList(scenarios), ", ") }
