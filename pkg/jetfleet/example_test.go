package jetfleet_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// SendEmail are the arguments of a job: their type names the job kind.
type SendEmail struct {
	To      string `json:"to"`
	Subject string `json:"subject"`
}

func (SendEmail) Kind() string  { return "send-email" }
func (SendEmail) Queue() string { return "emails" }

// A job type, its handler on an agent, and a job enqueued and waited for.
func Example() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The agent side: a handler of SendEmail jobs, on queue emails.
	a, err := agent.New(nc, agent.Config{Queues: []string{"emails"}})
	if err != nil {
		panic(err)
	}
	err = agent.AddHandler(a, func(ctx context.Context, job *agent.Job, email SendEmail) error {
		fmt.Printf("sending %q to %s\n", email.Subject, email.To)
		return nil
	})
	if err != nil {
		panic(err)
	}
	if err := a.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = a.Stop(ctx) }()

	// The client side: enqueue one job and wait until it has run.
	client := jetfleet.NewClient(nc)
	res, err := client.Enqueue(ctx, SendEmail{To: "ada@example.com", Subject: "Welcome"}, jetfleet.WithMaxAttempts(3))
	if err != nil {
		panic(err)
	}
	job, err := client.Wait(ctx, res.JobID)
	if err != nil {
		panic(err)
	}
	fmt.Println("job", job.State, "on queue", job.Queue, "after", job.Attempt, "attempt")
	// Output:
	// sending "Welcome" to ada@example.com
	// job succeeded on queue emails after 1 attempt
}

// A unique key keeps one job per key in a queue and kind: held until the
// job finished (or for a period, WithUniqueFor), another Enqueue of the
// key stores nothing and returns the job that holds it. The supervisor
// releases the key when the job succeeds, is dead-lettered or cancelled.
func ExampleWithUnique() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := jetfleet.NewClient(nc)

	digest := SendEmail{To: "ada@example.com", Subject: "Your weekly digest"}
	first, err := client.Enqueue(ctx, digest, jetfleet.WithJobID("digest-ada-1"),
		jetfleet.WithUnique("digest:ada", jetfleet.UniqueOptions{UntilFinished: true}))
	if err != nil {
		panic(err)
	}
	again, err := client.Enqueue(ctx, digest, jetfleet.WithJobID("digest-ada-2"),
		jetfleet.WithUnique("digest:ada", jetfleet.UniqueOptions{UntilFinished: true}))
	if err != nil {
		panic(err)
	}
	fmt.Println(first.JobID, first.Duplicate)
	fmt.Println(again.JobID, again.Duplicate)
	// Output:
	// digest-ada-1 false
	// digest-ada-1 true
}

// A job id is an idempotency key: enqueueing it again within the duplicate
// window stores nothing new.
func ExampleWithJobID() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := jetfleet.NewClient(nc)

	first, err := client.Enqueue(ctx, SendEmail{To: "ada@example.com"}, jetfleet.WithJobID("welcome-ada"))
	if err != nil {
		panic(err)
	}
	again, err := client.Enqueue(ctx, SendEmail{To: "ada@example.com"}, jetfleet.WithJobID("welcome-ada"))
	if err != nil {
		panic(err)
	}
	fmt.Println(first.JobID, first.Duplicate)
	fmt.Println(again.JobID, again.Duplicate, again.Sequence == first.Sequence)
	// Output:
	// welcome-ada false
	// welcome-ada true true
}

// A schedule fires jobs of a kind; TriggerSchedule fires one now. The dev
// fleet's agent runs the demo kind echo.
func ExampleClient_AddSchedule() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := jetfleet.NewClient(nc)

	_, err := client.AddSchedule(ctx, &jetfleet.Schedule{
		ID:     "nightly-report",
		Spec:   jetfleet.Spec{Cron: "0 2 * * *", Zone: "Europe/Berlin"},
		Target: jetfleet.Target{Queue: "default", Kind: "echo", Payload: []byte(`{"report":"nightly"}`)},
		Policy: jetfleet.Policy{Overlap: jetfleet.OverlapSkip},
	})
	if err != nil {
		panic(err)
	}
	preview, err := client.PreviewSchedule(ctx, jetfleet.PreviewRequest{ID: "nightly-report", Count: 2,
		From: time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC)})
	if err != nil {
		panic(err)
	}
	// 02:00 does not exist in Berlin on 29 March 2026 (clocks jump to 03:00):
	// the run of that night fires at the first instant after the gap.
	for _, t := range preview.Times {
		fmt.Println("fires at", t.Format(time.RFC3339))
	}
	fired, err := client.TriggerSchedule(ctx, "nightly-report")
	if err != nil {
		panic(err)
	}
	job, err := client.Wait(ctx, fired.JobID)
	if err != nil {
		panic(err)
	}
	fmt.Println("triggered:", fired.Outcome, "then", job.State)
	// Output:
	// fires at 2026-03-29T03:00:00+02:00
	// fires at 2026-03-30T02:00:00+02:00
	// triggered: fired then succeeded
}

// The supervisor keeps the last executions of every kind and schedule, with
// their statistics.
func ExampleClient_History() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := jetfleet.NewClient(nc)

	for i := range 3 {
		res, err := client.Enqueue(ctx, echo{N: i})
		if err != nil {
			panic(err)
		}
		if _, err := client.Wait(ctx, res.JobID); err != nil {
			panic(err)
		}
	}
	// The supervisor writes history as it reads the jobs' events: it may
	// trail the jobs by a moment.
	history, err := waitHistory(ctx, client, jetfleet.HistoryRequest{Queue: "default", Kind: "echo"}, 3)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%d executions, %d succeeded, success rate %.0f%%\n", history.Stats.Executions, history.Stats.Succeeded,
		100*history.Stats.SuccessRate)
	// Output:
	// 3 executions, 3 succeeded, success rate 100%
}

// echo are the arguments of the dev agent's demo kind echo.
type echo struct {
	N int `json:"n"`
}

func (echo) Kind() string { return "echo" }

// waitHistory asks for history until it holds at least n executions.
func waitHistory(ctx context.Context, client *jetfleet.Client, req jetfleet.HistoryRequest, n int) (*jetfleet.HistoryResponse, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		res, err := client.History(ctx, req)
		if err == nil && res.Stats.Executions >= n {
			return res, nil
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("history: %w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// Charge are the arguments of a job that fails until its card works.
type Charge struct {
	Cents int `json:"cents"`
}

func (Charge) Kind() string  { return "charge" }
func (Charge) Queue() string { return "billing" }

// A job that fails for good lands in the dead-letter stream; once the
// cause is fixed, replaying the letter runs it again.
func ExampleClient_ReplayDeadLetters() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var cardWorks atomic.Bool
	a, err := agent.New(nc, agent.Config{Queues: []string{"billing"}})
	if err != nil {
		panic(err)
	}
	err = agent.AddHandler(a, func(ctx context.Context, job *agent.Job, c Charge) error {
		if !cardWorks.Load() {
			return agent.NonRetryable(errors.New("card declined"))
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	if err := a.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = a.Stop(ctx) }()

	client := jetfleet.NewClient(nc)
	res, err := client.Enqueue(ctx, Charge{Cents: 500})
	if err != nil {
		panic(err)
	}
	_, err = client.Wait(ctx, res.JobID)
	var failed *jetfleet.JobFailedError
	if errors.As(err, &failed) {
		fmt.Println("dead:", failed.Job.Reason, "-", failed.Job.Error)
	}

	letters, err := client.ListDeadLetters(ctx, jetfleet.DLQListRequest{DLQFilter: jetfleet.DLQFilter{Queue: "billing"}})
	if err != nil {
		panic(err)
	}
	cardWorks.Store(true)
	replay, err := client.ReplayDeadLetters(ctx, jetfleet.ReplayRequest{Sequence: letters.Letters[0].Sequence})
	if err != nil {
		panic(err)
	}
	job, err := client.Wait(ctx, replay.Results[0].JobID, jetfleet.WaitForSequence(replay.Results[0].JobSequence))
	if err != nil {
		panic(err)
	}
	fmt.Println("replayed:", job.State, "at attempt", job.Attempt)
	// Output:
	// dead: non_retryable - card declined
	// replayed: succeeded at attempt 1
}

// Resize are the arguments of a long job that reports its progress.
type Resize struct {
	Images int `json:"images"`
}

func (Resize) Kind() string  { return "resize" }
func (Resize) Queue() string { return "images" }

// A handler reports how far it got with agent.ReportProgress; the job's
// status shows the latest report while it runs.
func Example_progress() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	finish := make(chan struct{})
	a, err := agent.New(nc, agent.Config{Queues: []string{"images"}})
	if err != nil {
		panic(err)
	}
	err = agent.AddHandler(a, func(ctx context.Context, job *agent.Job, r Resize) error {
		if err := agent.ReportProgress(ctx, 0.4, fmt.Sprintf("resizing image 4 of %d", r.Images)); err != nil {
			return err
		}
		<-finish // the rest of the work
		return nil
	})
	if err != nil {
		panic(err)
	}
	if err := a.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = a.Stop(ctx) }()

	client := jetfleet.NewClient(nc)
	res, err := client.Enqueue(ctx, Resize{Images: 10})
	if err != nil {
		panic(err)
	}
	for {
		job, err := client.Job(ctx, res.JobID)
		if err == nil && job.Progress != nil {
			fmt.Println(job.State+":", job.Progress)
			break
		}
		if ctx.Err() != nil {
			panic(ctx.Err())
		}
		time.Sleep(10 * time.Millisecond) // polling the job's status, as a client would
	}
	close(finish)
	// Output:
	// running: 40% — resizing image 4 of 10
}

// CallPartnerAPI are the arguments of a job that calls a rate-limited API.
type CallPartnerAPI struct {
	Order int `json:"order"`
}

func (CallPartnerAPI) Kind() string  { return "call-partner" }
func (CallPartnerAPI) Queue() string { return "partners" }

// SetLimit caps a kind across every agent: here 2 running at once and 10
// starts a second. A job over the limit waits (state waiting) without
// spending an attempt.
func ExampleClient_SetLimit() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := jetfleet.NewClient(nc)
	err := client.SetLimit(ctx, "partners", "call-partner", jetfleet.KindLimit{Concurrency: 2, Rate: 10, Period: time.Second})
	if err != nil {
		panic(err)
	}

	var running, most atomic.Int32
	a, err := agent.New(nc, agent.Config{Queues: []string{"partners"}, Concurrency: 10})
	if err != nil {
		panic(err)
	}
	err = agent.AddHandler(a, func(ctx context.Context, job *agent.Job, call CallPartnerAPI) error {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(150 * time.Millisecond) // the call
		return nil
	})
	if err != nil {
		panic(err)
	}
	if err := a.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = a.Stop(ctx) }()

	var ids []string
	for i := range 6 {
		res, err := client.Enqueue(ctx, CallPartnerAPI{Order: i})
		if err != nil {
			panic(err)
		}
		ids = append(ids, res.JobID)
	}
	for _, id := range ids {
		if _, err := client.Wait(ctx, id); err != nil {
			panic(err)
		}
	}
	limits, err := client.Limits(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("most running at once:", most.Load())
	fmt.Println("limit:", limits[0].Queue, limits[0].Kind, limits[0].Limit.Concurrency, limits[0].Limit.Rate, limits[0].Limit.Period)
	fmt.Println(client.SetLimit(ctx, "partners", "call-partner", jetfleet.KindLimit{Rate: 0, Period: time.Minute}))
	// Output:
	// most running at once: 2
	// limit: partners call-partner 2 10 1s
	// invalid_argument: limit of partners/call-partner: period "1m0s" without a rate: a rate of zero starts nothing; give rate > 0 or no period
}

// CountRows are the arguments of a job that returns a result.
type CountRows struct {
	Table string `json:"table"`
}

func (CountRows) Kind() string { return "count-rows" }

// A handler returns a result with agent.RecordResult; Wait (and Job)
// return it with the job's status.
func Example_result() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	a, err := agent.New(nc, agent.Config{})
	if err != nil {
		panic(err)
	}
	err = agent.AddHandler(a, func(ctx context.Context, job *agent.Job, c CountRows) error {
		return agent.RecordResult(ctx, map[string]any{"table": c.Table, "rows": 1042})
	})
	if err != nil {
		panic(err)
	}
	if err := a.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = a.Stop(ctx) }()

	client := jetfleet.NewClient(nc)
	res, err := client.Enqueue(ctx, CountRows{Table: "orders"})
	if err != nil {
		panic(err)
	}
	job, err := client.Wait(ctx, res.JobID)
	if err != nil {
		panic(err)
	}
	var counted struct {
		Table string `json:"table"`
		Rows  int    `json:"rows"`
	}
	if err := job.DecodeResult(&counted); err != nil {
		panic(err)
	}
	fmt.Println(job.State, string(job.Result))
	fmt.Println(counted.Table, counted.Rows)
	// Output:
	// succeeded {"rows":1042,"table":"orders"}
	// orders 1042
}
