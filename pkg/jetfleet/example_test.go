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
	defer a.Stop(ctx)

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
	defer a.Stop(ctx)

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
	defer a.Stop(ctx)

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
