package bench

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/natsconn"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Scenario names, in the order "all" runs them.
const (
	ScenarioThroughput = "throughput"
	ScenarioLatency    = "latency"
	ScenarioSchedules  = "schedules"
	ScenarioRescue     = "rescue"
	ScenarioFailover   = "failover"
	ScenarioDurability = "durability"
	ScenarioDelayed    = "delayed"
	ScenarioPriority   = "priority"
	ScenarioWorkflow   = "workflow"
)

// Scenarios lists every scenario in the order "all" runs them.
var Scenarios = []string{ScenarioThroughput, ScenarioLatency, ScenarioSchedules, ScenarioRescue, ScenarioFailover, ScenarioDurability,
	ScenarioDelayed, ScenarioPriority, ScenarioWorkflow}

// Config sizes the scenarios. Zero values mean the documented default.
type Config struct {
	// Server is the NATS URL to run against. Empty (the default) runs every
	// run of every scenario on a fresh embedded server with a file store in
	// a temporary directory, removed afterwards.
	Server string `json:"server,omitempty"`
	// NATS holds the credentials for Server; its URL is ignored.
	NATS natsconn.Config `json:"-"`
	// Scenarios to run, in order; "all" stands for every one. Defaults to all.
	Scenarios []string `json:"scenarios"`
	// Runs of each scenario: every figure is reported as min/median/max
	// over them. Defaults to 3.
	Runs int `json:"runs"`

	// Jobs is N, the no-op jobs of each throughput phase. Defaults to 50,000.
	Jobs int `json:"jobs"`
	// Agents is K, the agents (each on its own connection) of the
	// throughput and latency scenarios; the raw baseline runs as many
	// consumers. Defaults to 1.
	Agents int `json:"agents"`
	// Concurrency is C: each agent's concurrency, and the messages each
	// raw consumer has in flight. Defaults to 50.
	Concurrency int `json:"concurrency"`
	// Prefetch is each agent's agent.prefetch: the jobs it pulls ahead of
	// free slots. Defaults to 0. (The raw baseline's Consume pulls up to
	// C messages ahead of its C workers in any case.) The durability
	// scenario sets its own per setting.
	Prefetch int `json:"prefetch"`
	// PayloadSize is the size in bytes of each job's JSON payload. Defaults to 100.
	PayloadSize int `json:"payload_size"`

	// Rate is the latency scenario's offered load in jobs per second. Defaults to 400.
	Rate int `json:"rate"`
	// Duration is how long the latency scenario offers it. Defaults to 10s.
	Duration time.Duration `json:"duration"`

	// Schedules is S, the one-shot schedules due in the same second. Defaults to 10,000.
	Schedules int `json:"schedules"`
	// ScheduleLead is how long before their due second the schedules are
	// written; they must be loaded by then. Defaults to 3s.
	ScheduleLead time.Duration `json:"schedule_lead"`
	// IdleSchedules are loaded (definition and state) to measure the heap a
	// scheduler holds per idle schedule. Defaults to 100,000.
	IdleSchedules int `json:"idle_schedules"`

	// RescueJobs are the jobs the killed agent holds. Defaults to 50.
	RescueJobs int `json:"rescue_jobs"`

	// Replicas of the scheduler in the failover scenario (at least 2). Defaults to 2.
	Replicas int `json:"replicas"`
	// LeaseTTL is topology.lease_ttl in the failover scenario. Defaults to
	// 5s, the shipped default.
	LeaseTTL time.Duration `json:"lease_ttl"`

	// DurabilityJobs are the jobs of each durability phase. Defaults to Jobs.
	DurabilityJobs int `json:"durability_jobs"`

	// DelayedJobs is D, the delayed jobs stored (due in an hour). Defaults to 1,000,000.
	DelayedJobs int `json:"delayed_jobs"`
	// PriorityBacklog is L, the low-priority jobs that drain while
	// high-priority ones are offered at Rate. Defaults to 100,000.
	PriorityBacklog int `json:"priority_backlog"`
	// DelayedBurst is B, the delayed jobs due within one second, and the
	// plain jobs of the baseline. Defaults to 10,000.
	DelayedBurst int `json:"delayed_burst"`
	// FanOut is N, the elements of the workflow scenario's fan-out and its
	// plain jobs. Defaults to 10,000.
	FanOut int `json:"fan_out"`

	// Logger receives the components' logs. Defaults to discarding them.
	Logger *slog.Logger `json:"-"`
	// Progress receives a line per phase as the bench goes. Defaults to none.
	Progress io.Writer `json:"-"`
}

// Defaults of Config.
const (
	DefaultRuns            = 3
	DefaultJobs            = 50_000
	DefaultAgents          = 1
	DefaultConcurrency     = 50
	DefaultPayloadSize     = workload.DefaultPayloadSize
	DefaultRate            = 400
	DefaultDuration        = 10 * time.Second
	DefaultSchedules       = 10_000
	DefaultScheduleLead    = 3 * time.Second
	DefaultIdleSchedules   = 100_000
	DefaultRescueJobs      = 50
	DefaultReplicas        = 2
	DefaultLeaseTTL        = topology.DefaultLeaseTTL
	DefaultDelayedJobs     = 1_000_000
	DefaultDelayedBurst    = 10_000
	DefaultPriorityBacklog = 100_000
	DefaultFanOut          = 10_000
)

// Smoke returns a configuration that runs every scenario once at a tiny
// size, to check that the bench works (CI), not to measure.
func Smoke() Config {
	return Config{
		Runs: 1, Jobs: 300, Rate: 200, Duration: time.Second, Schedules: 200, ScheduleLead: 2 * time.Second,
		IdleSchedules: 10_000, RescueJobs: 5, LeaseTTL: time.Second, DelayedJobs: 2_000, DelayedBurst: 200, PriorityBacklog: 10_000,
		FanOut: 200,
	}
}

// WithDefaults returns c with every zero value replaced by its default.
func (c Config) WithDefaults() Config {
	if len(c.Scenarios) == 0 || slices.Contains(c.Scenarios, "all") {
		c.Scenarios = slices.Clone(Scenarios)
	}
	setDefault(&c.Runs, DefaultRuns)
	setDefault(&c.Jobs, DefaultJobs)
	setDefault(&c.Agents, DefaultAgents)
	setDefault(&c.Concurrency, DefaultConcurrency)
	setDefault(&c.PayloadSize, DefaultPayloadSize)
	setDefault(&c.Rate, DefaultRate)
	setDefault(&c.Duration, DefaultDuration)
	setDefault(&c.Schedules, DefaultSchedules)
	setDefault(&c.ScheduleLead, DefaultScheduleLead)
	setDefault(&c.IdleSchedules, DefaultIdleSchedules)
	setDefault(&c.RescueJobs, DefaultRescueJobs)
	setDefault(&c.Replicas, DefaultReplicas)
	setDefault(&c.LeaseTTL, DefaultLeaseTTL)
	setDefault(&c.DurabilityJobs, c.Jobs)
	setDefault(&c.DelayedJobs, DefaultDelayedJobs)
	setDefault(&c.DelayedBurst, DefaultDelayedBurst)
	setDefault(&c.PriorityBacklog, DefaultPriorityBacklog)
	setDefault(&c.FanOut, DefaultFanOut)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func setDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Validate checks c; each error names the setting (the flag of `jetfleet bench`).
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("bench: %s: %s", key, fmt.Sprintf(format, args...)))
	}
	for _, s := range c.Scenarios {
		if s != "all" && !slices.Contains(Scenarios, s) {
			bad("scenario", "unknown scenario %q; want all or some of %s", s, strings.Join(Scenarios, ","))
		}
	}
	for _, v := range []struct {
		key      string
		val, min int
	}{
		{"runs", c.Runs, 1}, {"jobs", c.Jobs, 1}, {"agents", c.Agents, 1}, {"concurrency", c.Concurrency, 1},
		{"prefetch", c.Prefetch, 0},
		{"payload-size", c.PayloadSize, 8}, {"rate", c.Rate, 1}, {"schedules", c.Schedules, 1},
		{"idle-schedules", c.IdleSchedules, 1}, {"rescue-jobs", c.RescueJobs, 1}, {"replicas", c.Replicas, 2},
		{"durability-jobs", c.DurabilityJobs, 1},
		{"delayed-jobs", c.DelayedJobs, 1},
		{"delayed-burst", c.DelayedBurst, 10},
		{"priority-backlog", c.PriorityBacklog, 1},
		{"fan-out", c.FanOut, 1},
	} {
		if v.val != 0 && v.val < v.min {
			bad(v.key, "must be at least %d, got %d", v.min, v.val)
		}
	}
	if c.PayloadSize > topology.DefaultMaxJobSize {
		bad("payload-size", "must be at most %d (topology.max_job_size), got %d", topology.DefaultMaxJobSize, c.PayloadSize)
	}
	if c.Duration < 0 || (c.Duration > 0 && c.Duration < 100*time.Millisecond) {
		bad("duration", "must be at least 100ms, got %s", c.Duration)
	}
	if c.ScheduleLead < 0 || (c.ScheduleLead > 0 && c.ScheduleLead < time.Second) {
		bad("schedule-lead", "must be at least 1s, got %s", c.ScheduleLead)
	}
	if c.LeaseTTL < 0 || (c.LeaseTTL > 0 && c.LeaseTTL < time.Second) {
		bad("lease-ttl", "must be at least 1s (topology.lease_ttl), got %s", c.LeaseTTL)
	}
	if err := c.NATS.Validate("nats"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
