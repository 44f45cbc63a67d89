package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/jetfleet/jetfleet/pkg/bench"
)

func init() {
	register(&command{name: "bench", summary: "measure the fleet against raw JetStream in the same run",
		help: "Measures jetfleet against a raw JetStream baseline in the same run: throughput, latency,\n" +
			"schedules, rescue, failover and durability (docs/performance.md says what each figure means).\n" +
			"Every run uses a fresh embedded server unless -server is given.",
		output: true, setup: setupBench})
}

// benchFlags are bench's flags, read into a bench.Config whose sizes
// default to those of def.
type benchFlags struct {
	cfg            bench.Config
	credentials    *credentialFlags
	scenario       string
	verbose, quiet bool
	cpuProfile     string
}

func addBenchFlags(fs *flag.FlagSet, def bench.Config) *benchFlags {
	b := &benchFlags{}
	cfg := &b.cfg
	def = def.WithDefaults()
	fs.StringVar(&b.scenario, "scenario", "all", "scenarios to run, comma-separated: all or "+strings.Join(bench.Scenarios, ","))
	fs.Bool("smoke", false, "a quick check that every scenario works (tiny sizes, one run): for CI, not for figures")
	fs.StringVar(&cfg.Server, "server", "", "NATS server `url` to run against instead of an embedded server (never $NATS_URL)")
	b.credentials = addCredentialFlags(fs)
	fs.IntVar(&cfg.Runs, "runs", def.Runs, "runs of each scenario; figures show min/median/max over them")
	fs.IntVar(&cfg.Jobs, "jobs", def.Jobs, "throughput: no-op jobs per phase (N)")
	fs.IntVar(&cfg.Agents, "agents", def.Agents, "throughput, latency: agents, each on its own connection (K); the raw baseline runs as many consumers")
	fs.IntVar(&cfg.Concurrency, "concurrency", def.Concurrency, "throughput, latency: concurrency of each agent, and messages in flight per raw consumer (C)")
	fs.IntVar(&cfg.Prefetch, "prefetch", def.Prefetch, "throughput, latency, delayed, priority, workflow: each agent's agent.prefetch, jobs pulled ahead of free slots (raw consumers pull up to C ahead in any case; durability sets its own)")
	fs.IntVar(&cfg.PayloadSize, "payload-size", def.PayloadSize, "bytes of each job's JSON payload")
	fs.IntVar(&cfg.Rate, "rate", def.Rate, "latency: offered load in jobs per second")
	fs.DurationVar(&cfg.Duration, "duration", def.Duration, "latency: how long the load is offered")
	fs.IntVar(&cfg.Schedules, "schedules", def.Schedules, "schedules: one-shot schedules due in the same second (S)")
	fs.DurationVar(&cfg.ScheduleLead, "schedule-lead", def.ScheduleLead, "schedules: how long before their due second the schedules are written")
	fs.IntVar(&cfg.IdleSchedules, "idle-schedules", def.IdleSchedules, "schedules: idle schedules loaded to measure heap per schedule")
	fs.IntVar(&cfg.RescueJobs, "rescue-jobs", def.RescueJobs, "rescue: jobs the killed agent holds")
	fs.IntVar(&cfg.Replicas, "replicas", def.Replicas, "failover: scheduler replicas")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", def.LeaseTTL, "failover: leader lease TTL (topology.lease_ttl)")
	fs.IntVar(&cfg.DurabilityJobs, "durability-jobs", def.DurabilityJobs, "durability: jobs per phase (0: as many as -jobs)")
	fs.IntVar(&cfg.DelayedJobs, "delayed-jobs", def.DelayedJobs, "delayed: D, the delayed jobs stored (due in an hour)")
	fs.IntVar(&cfg.PriorityBacklog, "priority-backlog", def.PriorityBacklog, "priority: L, the low-priority jobs that drain while high ones are offered at -rate")
	fs.IntVar(&cfg.DelayedBurst, "delayed-burst", def.DelayedBurst, "delayed: B, the delayed jobs due within one second, and the plain jobs of the baseline")
	fs.IntVar(&cfg.FanOut, "fan-out", def.FanOut, "workflow: N, the elements of one run's fan-out, and the plain jobs of the baseline")
	fs.BoolVar(&b.verbose, "v", false, "log the components' warnings and errors to stderr")
	fs.BoolVar(&b.quiet, "q", false, "no progress lines on stderr")
	fs.StringVar(&b.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole bench to `file` (go tool pprof)")
	return b
}

func setupBench(fs *flag.FlagSet) action {
	b := addBenchFlags(fs, bench.Config{})
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		// With -smoke, every size defaults to the smoke's, and flags given override it.
		if smokeRequested(inv.raw) {
			sfs, sinv, _ := inv.cmd.flagSetWith(inv.out, func(fs *flag.FlagSet) action {
				b = addBenchFlags(fs, bench.Smoke())
				return nil
			})
			if _, err := parseArgs(sfs, inv.raw); err != nil {
				return err
			}
			inv = sinv
		}
		return runBench(ctx, inv, b)
	}
}

func runBench(ctx context.Context, inv *invocation, b *benchFlags) error {
	cfg := b.cfg
	if err := b.credentials.apply(&cfg.NATS); err != nil {
		return err
	}
	cfg.Scenarios = strings.Split(b.scenario, ",")
	if b.verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if !b.quiet {
		cfg.Progress = os.Stderr
	}
	if b.cpuProfile != "" {
		f, err := os.Create(b.cpuProfile)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := f.Close(); cerr != nil {
				fmt.Fprintf(os.Stderr, "jetfleet bench: writing the CPU profile %s: %v\n", b.cpuProfile, cerr)
			}
		}()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if note := devBuildNote(debug.ReadBuildInfo()); note != "" {
		fmt.Fprintln(os.Stderr, "jetfleet bench: "+note)
	}
	report, err := bench.Run(ctx, cfg)
	if err != nil {
		if report != nil && len(report.Figures) > 0 {
			fmt.Fprintln(os.Stderr, "jetfleet bench: figures measured before the failure:")
			_ = report.WriteTable(os.Stderr)
		}
		return err
	}
	return inv.print(benchJSON(report), report.WriteTable)
}

// devBuildNote warns when the binary was compiled without inlining, as go tool task dev builds it for a quicker
// first start: the embedded server and the fleet run slower than a release build's, and so do the figures.
func devBuildNote(info *debug.BuildInfo, ok bool) string {
	if !ok {
		return ""
	}
	for _, s := range info.Settings {
		if s.Key != "-gcflags" {
			continue
		}
		_, flags, _ := strings.Cut(s.Value, "=")
		if slices.Contains(strings.Fields(flags), "-l") {
			return "this binary was built without inlining (go tool task dev builds it so, to start sooner); " +
				"its figures are lower than a release build's: measure with go tool task bench or go tool task build's binary"
		}
	}
	return ""
}

// smokeRequested reports whether args ask for -smoke, before the flags are
// parsed, so that the smoke's sizes become the defaults.
func smokeRequested(args []string) bool {
	smoke := false
	for _, a := range args {
		if a == "--" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "smoke" {
			continue
		}
		smoke = true
		if hasValue {
			smoke, _ = strconv.ParseBool(value)
		}
	}
	return smoke
}
