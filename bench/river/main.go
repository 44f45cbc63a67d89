// Command river measures River's (github.com/riverqueue/river) enqueue and
// end-to-end throughput on a local PostgreSQL, with the workload shape of
// jetfleet's throughput scenario (pkg/bench): N no-op jobs with a 100-byte
// JSON payload, one client with MaxWorkers 50 on one queue. It is a
// comparison harness outside the jetfleet workspace: its own module, not in
// go.work, not built by CI. See README.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const queueName = river.QueueDefault

// NoopArgs is the job's args: one string field, padded so that the encoded
// args are exactly -payload bytes of JSON (jetfleet's payload is 100 bytes
// of JSON too).
type NoopArgs struct {
	P string `json:"p"`
}

func (NoopArgs) Kind() string { return "noop" }

// NoopWorker does nothing.
type NoopWorker struct {
	river.WorkerDefaults[NoopArgs]
}

func (NoopWorker) Work(context.Context, *river.Job[NoopArgs]) error { return nil }

type options struct {
	dsn           string
	jobs          int
	runs          int
	batch         int
	workers       int
	payload       int
	poolConns     int
	fetchCooldown time.Duration
	fetchPoll     time.Duration
	enqueue       bool
	timeout       time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", envOr("RIVERBENCH_DSN", "postgres://riverbench:riverbench@127.0.0.1:5432/riverbench?sslmode=disable"), "PostgreSQL URL (or $RIVERBENCH_DSN)")
	flag.IntVar(&o.jobs, "jobs", 50_000, "N: jobs per phase")
	flag.IntVar(&o.runs, "runs", 3, "runs of each phase")
	flag.IntVar(&o.batch, "batch", 1_000, "jobs per InsertManyFast call")
	flag.IntVar(&o.workers, "workers", 50, "MaxWorkers of the one queue")
	flag.IntVar(&o.payload, "payload", 100, "size in bytes of each job's encoded JSON args")
	flag.IntVar(&o.poolConns, "pool-conns", 20, "pgxpool MaxConns")
	flag.DurationVar(&o.fetchCooldown, "fetch-cooldown", 0, "River Config.FetchCooldown (0: River's default, 100ms)")
	flag.DurationVar(&o.fetchPoll, "fetch-poll-interval", 0, "River Config.FetchPollInterval (0: River's default, 1s)")
	flag.BoolVar(&o.enqueue, "enqueue", true, "also measure the enqueue rate (inserts with no workers running)")
	flag.DurationVar(&o.timeout, "timeout", 0, "longest one end-to-end phase may take (0: 1 min + 20 ms per job)")
	flag.Parse()
	if o.jobs < 1 || o.runs < 1 || o.batch < 1 || o.workers < 1 || o.payload < len(`{"p":""}`) {
		log.Fatal("bad flags: -jobs, -runs, -batch, -workers must be ≥ 1, -payload ≥ 8")
	}
	if o.timeout == 0 {
		o.timeout = time.Minute + time.Duration(o.jobs)*20*time.Millisecond
	}
	if err := run(context.Background(), o); err != nil {
		log.Fatal(err)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context, o options) error {
	cfg, err := pgxpool.ParseConfig(o.dsn)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(o.poolConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)

	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return err
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}

	settings, err := pgSettings(ctx, pool)
	if err != nil {
		return err
	}
	args := makeArgs(o.payload)
	enc, _ := json.Marshal(args)

	fmt.Printf("River %s (riverpgxv5 %s, pgx %s), %s\n", modVersion("github.com/riverqueue/river"),
		modVersion("github.com/riverqueue/river/riverdriver/riverpgxv5"), modVersion("github.com/jackc/pgx/v5"), runtime.Version())
	fmt.Printf("PostgreSQL %s\n", settings["server_version"])
	fmt.Printf("settings: fsync=%s synchronous_commit=%s wal_sync_method=%s full_page_writes=%s shared_buffers=%s\n",
		settings["fsync"], settings["synchronous_commit"], settings["wal_sync_method"], settings["full_page_writes"], settings["shared_buffers"])
	fmt.Printf("migrations applied now: %d\n", len(res.Versions))
	fmt.Printf("workload: jobs=%d runs=%d MaxWorkers=%d insert=InsertManyFast batch=%d payload=%d bytes JSON, pool MaxConns=%d, GOMAXPROCS=%d\n",
		o.jobs, o.runs, o.workers, o.batch, len(enc), o.poolConns, runtime.GOMAXPROCS(0))
	fmt.Printf("River fetch: FetchCooldown=%s FetchPollInterval=%s%s\n",
		durOr(o.fetchCooldown, river.FetchCooldownDefault), durOr(o.fetchPoll, river.FetchPollIntervalDefault), defaultNote(o))

	newClient := func() (*river.Client[pgx.Tx], error) {
		workers := river.NewWorkers()
		river.AddWorker(workers, &NoopWorker{})
		return river.NewClient(driver, &river.Config{
			Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
			Queues:            map[string]river.QueueConfig{queueName: {MaxWorkers: o.workers}},
			Workers:           workers,
			FetchCooldown:     o.fetchCooldown,
			FetchPollInterval: o.fetchPoll,
		})
	}
	batches := makeBatches(o.jobs, o.batch, args)
	truncate := func() error {
		_, err := pool.Exec(ctx, "TRUNCATE river_job")
		return err
	}

	var enqRates, e2eRates []float64
	if o.enqueue {
		for r := 1; r <= o.runs; r++ {
			if err := truncate(); err != nil {
				return err
			}
			client, err := newClient() // never started: no workers run
			if err != nil {
				return err
			}
			t0 := time.Now()
			if err := insertAll(ctx, client, batches); err != nil {
				return err
			}
			d := time.Since(t0)
			n, err := countJobs(ctx, pool, "available")
			if err != nil {
				return err
			}
			if n != o.jobs {
				return fmt.Errorf("enqueue run %d: %d jobs available, want %d", r, n, o.jobs)
			}
			rate := float64(o.jobs) / d.Seconds()
			enqRates = append(enqRates, rate)
			fmt.Printf("enqueue run %d: %d jobs in %s = %.0f jobs/s\n", r, o.jobs, d.Round(time.Millisecond), rate)
		}
	}

	for r := 1; r <= o.runs; r++ {
		if err := truncate(); err != nil {
			return err
		}
		rate, err := endToEnd(ctx, o, newClient, batches, pool, r)
		if err != nil {
			return fmt.Errorf("end-to-end run %d: %w", r, err)
		}
		e2eRates = append(e2eRates, rate)
	}
	if err := truncate(); err != nil {
		return err
	}

	fmt.Println("summary (median, min–max of runs):")
	if o.enqueue {
		fmt.Printf("  enqueue     %s jobs/s\n", summary(enqRates))
	}
	fmt.Printf("  end to end  %s jobs/s\n", summary(e2eRates))
	return nil
}

// endToEnd starts a client (workers running), then inserts N jobs in
// batches while the workers work them, and returns N / (time from the
// first insert until the N-th job completed event).
func endToEnd(ctx context.Context, o options, newClient func() (*river.Client[pgx.Tx], error),
	batches [][]river.InsertManyParams, pool *pgxpool.Pool, r int) (float64, error) {
	client, err := newClient()
	if err != nil {
		return 0, err
	}
	events, cancelSub := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: o.jobs + 1000, // a full channel drops events
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancelSub()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := client.Stop(stopCtx); err != nil {
			log.Printf("stop: %v", err)
		}
	}()
	time.Sleep(500 * time.Millisecond) // let the producer, notifier and completer settle

	var done atomic.Int64
	allDone := make(chan time.Time, 1)
	bad := make(chan error, 1)
	go func() {
		for ev := range events {
			if ev.Kind != river.EventKindJobCompleted {
				select {
				case bad <- fmt.Errorf("unexpected event %s for job %d", ev.Kind, ev.Job.ID):
				default:
				}
				continue
			}
			if done.Add(1) == int64(o.jobs) {
				allDone <- time.Now()
			}
		}
	}()

	t0 := time.Now()
	insErr := make(chan error, 1)
	var insertDur time.Duration
	go func() {
		err := insertAll(ctx, client, batches)
		insertDur = time.Since(t0)
		insErr <- err
	}()
	timer := time.NewTimer(o.timeout)
	defer timer.Stop()
	var tEnd time.Time
	select {
	case tEnd = <-allDone:
	case err := <-bad:
		return 0, err
	case <-timer.C:
		return 0, fmt.Errorf("timed out after %s with %d of %d jobs completed", o.timeout, done.Load(), o.jobs)
	}
	if err := <-insErr; err != nil {
		return 0, err
	}
	d := tEnd.Sub(t0)
	n, err := countJobs(ctx, pool, "completed")
	if err != nil {
		return 0, err
	}
	if n != o.jobs {
		return 0, fmt.Errorf("%d jobs completed in river_job, want %d", n, o.jobs)
	}
	rate := float64(o.jobs) / d.Seconds()
	fmt.Printf("end-to-end run %d: %d jobs in %s = %.0f jobs/s (inserts done after %s)\n",
		r, o.jobs, d.Round(time.Millisecond), rate, insertDur.Round(time.Millisecond))
	return rate, nil
}

func insertAll(ctx context.Context, client *river.Client[pgx.Tx], batches [][]river.InsertManyParams) error {
	for _, b := range batches {
		n, err := client.InsertManyFast(ctx, b)
		if err != nil {
			return fmt.Errorf("InsertManyFast: %w", err)
		}
		if n != len(b) {
			return fmt.Errorf("InsertManyFast inserted %d of %d", n, len(b))
		}
	}
	return nil
}

func makeArgs(size int) NoopArgs {
	pad := size - len(`{"p":""}`)
	return NoopArgs{P: strings.Repeat("x", pad)}
}

func makeBatches(n, size int, args NoopArgs) [][]river.InsertManyParams {
	all := make([]river.InsertManyParams, n)
	for i := range all {
		all[i] = river.InsertManyParams{Args: args}
	}
	var out [][]river.InsertManyParams
	for len(all) > 0 {
		k := min(size, len(all))
		out = append(out, all[:k])
		all = all[k:]
	}
	return out
}

func countJobs(ctx context.Context, pool *pgxpool.Pool, state string) (int, error) {
	var n int
	err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = $1", state).Scan(&n)
	return n, err
}

func pgSettings(ctx context.Context, pool *pgxpool.Pool) (map[string]string, error) {
	out := map[string]string{}
	for _, k := range []string{"server_version", "fsync", "synchronous_commit", "wal_sync_method", "full_page_writes", "shared_buffers"} {
		var v string
		if err := pool.QueryRow(ctx, "SELECT current_setting($1)", k).Scan(&v); err != nil {
			return nil, fmt.Errorf("setting %s: %w", k, err)
		}
		out[k] = v
	}
	return out, nil
}

func modVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "?"
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			return d.Version
		}
	}
	return "?"
}

func durOr(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func defaultNote(o options) string {
	if o.fetchCooldown == 0 && o.fetchPoll == 0 {
		return " (River's defaults)"
	}
	return " (tuned, not River's defaults)"
}

func summary(rates []float64) string {
	if len(rates) == 0 {
		return "-"
	}
	s := slices.Clone(rates)
	slices.Sort(s)
	var med float64
	if len(s)%2 == 1 {
		med = s[len(s)/2]
	} else {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("%.0f (%.0f–%.0f)", med, s[0], s[len(s)-1])
}
