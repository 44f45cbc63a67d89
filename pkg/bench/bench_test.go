package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/bench"
	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/natstest"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

func TestMain(m *testing.M) {
	bench.RunChildServerIfAsked() // the delayed scenario's server
	natstest.VerifyNoLeaks(m)
}

// figures lists what each scenario must report.
var figures = map[string][]string{
	bench.ScenarioThroughput: {"enqueue_rate_raw", "enqueue_rate", "enqueue_ratio", "drain_rate_raw", "drain_rate_raw_event",
		"drain_rate", "drain_ratio", "drain_cpu_per_job_raw", "drain_cpu_per_job_raw_event", "drain_cpu_per_job", "end_to_end_rate_raw", "end_to_end_rate_raw_event", "end_to_end_rate", "end_to_end_ratio",
		"end_to_end_ratio_raw_event"},
	bench.ScenarioLatency: {"offered_rate", "enqueue_to_start_p50", "enqueue_to_start_p90", "enqueue_to_start_p99",
		"enqueue_to_start_max"},
	bench.ScenarioSchedules:  {"load_time", "fire_delay_p50", "fire_delay_p99", "fire_delay_max", "heap_per_idle_schedule"},
	bench.ScenarioRescue:     {"rescue_running", "rescue_complete"},
	bench.ScenarioFailover:   {"failover_next_fire"},
	bench.ScenarioDurability: durabilityFigures(),
	bench.ScenarioDelayed: {"delayed_store_rate", "server_rss_per_delayed_job", "server_peak_rss", "fleet_heap_none_delayed", "fleet_heap_d_delayed",
		"peak_rss", "due_to_start_p50", "due_to_start_p99", "due_to_start_max", "plain_burst_enqueue_to_start_p50",
		"plain_burst_enqueue_to_start_p99"},
	bench.ScenarioPriority: {"high_enqueue_to_start_p50_backlog", "high_enqueue_to_start_p99_backlog", "high_enqueue_to_start_p50_idle",
		"high_enqueue_to_start_p99_idle", "low_drain_rate"},
}

// durabilityFigures are the durability scenario's figures: rates, ratios
// store writes per job, heap growth and the agents' Stop for each setting,
// and ratios across them.
func durabilityFigures() []string {
	out := []string{"enqueue_ratio_always_default", "end_to_end_ratio_always_default", "end_to_end_ratio_r3_always_default"}
	for _, setting := range []string{"default_sync", "sync_always", "r3_sync_always", "r3_default_sync"} {
		for _, name := range []string{"enqueue_rate", "end_to_end_rate_raw", "end_to_end_rate", "end_to_end_ratio",
			"writes_per_job_raw", "writes_per_job", "writes_per_job_jobs", "writes_per_job_acks", "writes_per_job_events",
			"writes_per_job_kv", "heap_growth_raw", "heap_growth", "heap_growth_ratio", "agent_stop"} {
			out = append(out, name+"_"+setting)
		}
	}
	return out
}

// TestSmoke runs every scenario once at the smoke's sizes, as CI does, and
// checks that the report holds every figure with sane values. It checks
// shape and sanity, never speed. (Not parallel: the heap figure measures
// this process.)
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	cfg := bench.Smoke()
	cfg.Progress = &progress
	report, err := bench.Run(ctx, cfg)
	require.NoError(t, err, "progress:\n%s", progress.String())
	checkFigures(t, report, bench.Scenarios, 1)
	assert.Empty(t, report.Notes, "no scenario is skipped on the embedded server")

	fig := func(scenario, name string) float64 { return report.Figure(scenario, name).Median }
	for _, name := range []string{"enqueue_rate_raw", "enqueue_rate", "drain_rate_raw", "drain_rate_raw_event", "drain_rate",
		"end_to_end_rate_raw", "end_to_end_rate_raw_event", "end_to_end_rate"} {
		assert.Positive(t, fig(bench.ScenarioThroughput, name), name)
	}
	for _, name := range []string{"enqueue_ratio", "drain_ratio", "end_to_end_ratio", "end_to_end_ratio_raw_event",
		"drain_cpu_per_job_raw", "drain_cpu_per_job_raw_event", "drain_cpu_per_job"} {
		assert.Positive(t, fig(bench.ScenarioThroughput, name), name)
	}
	assert.Positive(t, fig(bench.ScenarioLatency, "offered_rate"))
	assert.Positive(t, fig(bench.ScenarioLatency, "enqueue_to_start_p50"))
	assert.LessOrEqual(t, fig(bench.ScenarioLatency, "enqueue_to_start_p50"), fig(bench.ScenarioLatency, "enqueue_to_start_p90"))
	assert.LessOrEqual(t, fig(bench.ScenarioLatency, "enqueue_to_start_p90"), fig(bench.ScenarioLatency, "enqueue_to_start_p99"))
	assert.LessOrEqual(t, fig(bench.ScenarioLatency, "enqueue_to_start_p99"), fig(bench.ScenarioLatency, "enqueue_to_start_max"))
	assert.Positive(t, fig(bench.ScenarioSchedules, "load_time"))
	assert.GreaterOrEqual(t, fig(bench.ScenarioSchedules, "fire_delay_p50"), 0.0, "JetStream stores a fire after it is due")
	assert.LessOrEqual(t, fig(bench.ScenarioSchedules, "fire_delay_p50"), fig(bench.ScenarioSchedules, "fire_delay_p99"))
	assert.LessOrEqual(t, fig(bench.ScenarioSchedules, "fire_delay_p99"), fig(bench.ScenarioSchedules, "fire_delay_max"))
	assert.Positive(t, fig(bench.ScenarioSchedules, "heap_per_idle_schedule"))
	assert.Positive(t, fig(bench.ScenarioRescue, "rescue_running"))
	assert.LessOrEqual(t, fig(bench.ScenarioRescue, "rescue_running"), fig(bench.ScenarioRescue, "rescue_complete"))
	assert.Positive(t, fig(bench.ScenarioFailover, "failover_next_fire"))
	for _, name := range figures[bench.ScenarioDurability] {
		if strings.HasPrefix(name, "writes_per_job_kv") {
			assert.GreaterOrEqual(t, fig(bench.ScenarioDurability, name), 0.0, name) // heartbeats, if one fell in the phase
			continue
		}
		assert.Positive(t, fig(bench.ScenarioDurability, name), name)
	}
	// Store writes are counted, not timed: each job is stored once and
	// removed once, and has one event (succeeded: a no-op job ends before
	// agent.started_event_after) — a resent event stored twice would show here.
	for _, setting := range []string{"default_sync", "sync_always", "r3_sync_always"} {
		assert.InDelta(t, 1.0, fig(bench.ScenarioDurability, "writes_per_job_jobs_"+setting), 1e-9, setting)
		assert.InDelta(t, 1.0, fig(bench.ScenarioDurability, "writes_per_job_acks_"+setting), 1e-9, setting)
		assert.InDelta(t, 1.0, fig(bench.ScenarioDurability, "writes_per_job_events_"+setting), 1e-9, setting)
		assert.InDelta(t, 2.0, fig(bench.ScenarioDurability, "writes_per_job_raw_"+setting), 0.5, setting)
	}
	assert.Positive(t, fig(bench.ScenarioDelayed, "delayed_store_rate"))
	assert.GreaterOrEqual(t, fig(bench.ScenarioDelayed, "due_to_start_p50"), 0.0, "a delayed job never starts before it is due")
	assert.LessOrEqual(t, fig(bench.ScenarioDelayed, "due_to_start_p50"), fig(bench.ScenarioDelayed, "due_to_start_p99"))
	assert.LessOrEqual(t, fig(bench.ScenarioDelayed, "due_to_start_p99"), fig(bench.ScenarioDelayed, "due_to_start_max"))
	assert.Positive(t, fig(bench.ScenarioDelayed, "peak_rss"))

	var table, js bytes.Buffer
	require.NoError(t, report.WriteTable(&table))
	assert.Contains(t, table.String(), "end to end, jetfleet / raw")
	assert.Contains(t, table.String(), "≥ 0.70×")
	require.NoError(t, report.WriteJSON(&js))
	var decoded bench.Report
	require.NoError(t, json.Unmarshal(js.Bytes(), &decoded), js.String())
	assert.Len(t, decoded.Figures, len(report.Figures))
	assert.Contains(t, js.String(), `"lease_ttl": "1s"`, "durations are written as Go durations")
}

// checkFigures checks that the report holds every figure of scenarios,
// with runs finite values each and consistent min ≤ median ≤ max.
func checkFigures(t *testing.T, report *bench.Report, scenarios []string, runs int) {
	t.Helper()
	for _, s := range scenarios {
		for _, name := range figures[s] {
			f := report.Figure(s, name)
			if !assert.NotNil(t, f, "figure %s of %s", name, s) {
				continue
			}
			assert.Len(t, f.Values, runs, name)
			for _, v := range f.Values {
				assert.False(t, math.IsNaN(v) || math.IsInf(v, 0), "%s is %v", name, v)
			}
			assert.LessOrEqual(t, f.Min, f.Median, name)
			assert.LessOrEqual(t, f.Median, f.Max, name)
			assert.NotEmpty(t, f.Label, name)
		}
	}
}

// tiny is a configuration for runs against a given server: the smoke's
// sizes, smaller still.
func tiny(url string, scenarios ...string) bench.Config {
	cfg := bench.Smoke()
	cfg.Server = url
	cfg.Scenarios = scenarios
	cfg.Jobs, cfg.Duration, cfg.Rate = 100, 200*time.Millisecond, 100
	return cfg
}

// TestGivenServerWithoutFleet runs against a server without a jetfleet
// topology: the bench provisions it, and deletes it afterwards.
func TestGivenServerWithoutFleet(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	report, err := bench.Run(ctx, tiny(srv.ClientURL(), bench.ScenarioThroughput, bench.ScenarioFailover))
	require.NoError(t, err)
	checkFigures(t, report, []string{bench.ScenarioThroughput, bench.ScenarioFailover}, 1)
	assert.Empty(t, streamNames(ctx, t, js), "the streams the bench created are gone")
}

// TestGivenServerWithFleet runs against a server that holds a fleet: only
// the scenarios that run agents on queues of their own run, the fleet's
// streams stay, and the bench's consumers and messages go.
func TestGivenServerWithFleet(t *testing.T) {
	t.Parallel()
	srv := natstest.Server(t)
	_, js := natstest.JetStream(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, topology.Ensure(ctx, js, topology.Config{}))
	_, err := js.Publish(ctx, protocol.JobSubject("default", "keep"), workload.Payload(20))
	require.NoError(t, err)
	before := streamNames(ctx, t, js)

	report, err := bench.Run(ctx, tiny(srv.ClientURL(), "all"))
	require.NoError(t, err)
	checkFigures(t, report, []string{bench.ScenarioThroughput, bench.ScenarioLatency}, 1)
	assert.Nil(t, report.Figure(bench.ScenarioSchedules, "fire_delay_p99"))
	notes := strings.Join(report.Notes, "\n")
	for _, s := range []string{bench.ScenarioSchedules, bench.ScenarioRescue, bench.ScenarioFailover, bench.ScenarioDurability} {
		assert.Contains(t, notes, s+" skipped")
	}

	assert.Equal(t, before, streamNames(ctx, t, js), "the fleet's streams stay")
	jobs, err := js.Stream(ctx, protocol.StreamJobs)
	require.NoError(t, err)
	info, err := jobs.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), info.State.Msgs, "only the fleet's own job is left")
	for name := range jobs.ConsumerNames(ctx).Name() {
		t.Errorf("consumer %s left behind", name)
	}
	events, err := js.Stream(ctx, protocol.StreamEvents)
	require.NoError(t, err)
	info, err = events.Info(ctx)
	require.NoError(t, err)
	assert.Zero(t, info.State.Msgs, "the bench's job events are purged")

	_, err = bench.Run(ctx, tiny(srv.ClientURL(), bench.ScenarioDurability))
	assert.ErrorContains(t, err, "needs the embedded server", "a scenario named explicitly fails rather than being skipped")
}

func streamNames(ctx context.Context, t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	var out []string
	names := js.StreamNames(ctx)
	for n := range names.Name() {
		out = append(out, n)
	}
	require.NoError(t, names.Err())
	return out
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  bench.Config
		want string
	}{
		{bench.Config{Scenarios: []string{"speed"}}, `scenario: unknown scenario "speed"`},
		{bench.Config{Jobs: -1}, "jobs: must be at least 1"},
		{bench.Config{Replicas: 1}, "replicas: must be at least 2"},
		{bench.Config{LeaseTTL: 100 * time.Millisecond}, "lease-ttl: must be at least 1s"},
		{bench.Config{PayloadSize: 1 << 20}, "payload-size: must be at most"},
	} {
		_, err := bench.Run(context.Background(), tc.cfg)
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	values := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	assert.Equal(t, 1, bench.Percentile(values, 0))
	assert.Equal(t, 5, bench.Percentile(values, 0.5))
	assert.Equal(t, 9, bench.Percentile(values, 0.99))
	assert.Equal(t, 10, bench.Percentile(values, 1))
	assert.Equal(t, 0, bench.Percentile([]int(nil), 0.5))
}

func TestPayload(t *testing.T) {
	t.Parallel()
	for _, size := range []int{8, 20, 86, 100, 1000} {
		p := workload.Payload(size)
		assert.Len(t, p, size)
		assert.True(t, json.Valid(p), "%s", p)
	}
}
