package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nuid"
)

// bencher runs the scenarios of one bench and collects the report.
type bencher struct {
	cfg    Config
	id     string // names queues, agents and schedules of this bench
	report *Report
}

// scenarioFunc runs one run of a scenario on its own server and records
// its figures.
type scenarioFunc func(b *bencher, ctx context.Context, run int) error

var scenarioFuncs = map[string]scenarioFunc{
	ScenarioThroughput: (*bencher).throughput,
	ScenarioLatency:    (*bencher).latency,
	ScenarioSchedules:  (*bencher).schedules,
	ScenarioRescue:     (*bencher).rescue,
	ScenarioFailover:   (*bencher).failover,
	ScenarioDurability: (*bencher).durability,
	ScenarioDelayed:    (*bencher).delayed,
	ScenarioPriority:   (*bencher).priority,
	ScenarioWorkflow:   (*bencher).workflow,
}

// Run runs the configured scenarios, each Runs times, and returns the
// report. A scenario that cannot run against the given server (it needs
// the embedded server, or a server without a fleet) is skipped with a note
// when it was selected through "all", and fails the bench when it was
// named.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	named := len(cfg.Scenarios) > 0 && !containsAll(cfg.Scenarios)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	b := &bencher{cfg: cfg, id: strings.ToLower(nuid.Next()[16:]), report: &Report{
		StartedAt: time.Now().UTC(), Config: cfg, Host: hostInfo(), Server: "embedded server (file store in a temporary directory, fresh for every run)",
	}}
	if cfg.Server != "" {
		b.report.Server = "NATS server " + cfg.Server
	}
	start := time.Now()
	for _, name := range cfg.Scenarios {
		for run := 1; run <= cfg.Runs; run++ {
			err := scenarioFuncs[name](b, ctx, run)
			if errors.Is(err, errNeedsEmbedded) || errors.Is(err, errNeedsOwnServer) {
				if named {
					return b.report, fmt.Errorf("scenario %s %w", name, err)
				}
				b.report.note("%s skipped: it %v", name, err)
				break
			}
			if err != nil {
				return b.report, fmt.Errorf("scenario %s, run %d: %w", name, run, err)
			}
		}
	}
	b.report.Duration = time.Since(start).Seconds()
	b.report.Host.LoadAvgEnd = loadAvg()
	return b.report, nil
}

func containsAll(s []string) bool { return slices.Contains(s, "all") }

// progress writes a line to the progress writer, if any.
func (b *bencher) progress(format string, args ...any) {
	if b.cfg.Progress != nil {
		fmt.Fprintf(b.cfg.Progress, "bench: "+format+"\n", args...)
	}
}

// record adds the value of one run of a figure.
func (b *bencher) record(scenario string, spec figureSpec, v float64) {
	b.report.add(scenario, spec, v)
}

// phaseTimeout bounds a phase of n jobs: generous, since the bench must
// end even when something is wrong, but never so short that a slow machine
// fails.
func phaseTimeout(n int) time.Duration {
	return time.Minute + time.Duration(n)*2*time.Millisecond
}

// MarshalJSON writes durations as Go duration strings ("10s").
func (c Config) MarshalJSON() ([]byte, error) {
	type plain Config
	return json.Marshal(struct {
		plain
		Duration     string `json:"duration"`
		ScheduleLead string `json:"schedule_lead"`
		LeaseTTL     string `json:"lease_ttl"`
	}{plain(c), c.Duration.String(), c.ScheduleLead.String(), c.LeaseTTL.String()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (c *Config) UnmarshalJSON(data []byte) error {
	type plain Config
	var v struct {
		*plain
		Duration     string `json:"duration"`
		ScheduleLead string `json:"schedule_lead"`
		LeaseTTL     string `json:"lease_ttl"`
	}
	v.plain = (*plain)(c)
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	for _, d := range []struct {
		s   string
		dst *time.Duration
	}{{v.Duration, &c.Duration}, {v.ScheduleLead, &c.ScheduleLead}, {v.LeaseTTL, &c.LeaseTTL}} {
		if d.s == "" {
			continue
		}
		parsed, err := time.ParseDuration(d.s)
		if err != nil {
			return err
		}
		*d.dst = parsed
	}
	return nil
}
