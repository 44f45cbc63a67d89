package jetfleet_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// The three kinds of a nightly export: list the files, export each one,
// summarize what happened.
type ListFiles struct{}

func (ListFiles) Kind() string  { return "list-files" }
func (ListFiles) Queue() string { return "nightly" }

type ExportFile struct {
	File string `json:"file"`
}

func (ExportFile) Kind() string  { return "export-file" }
func (ExportFile) Queue() string { return "nightly" }

type Summarize struct {
	Exported []struct {
		Item string `json:"item"`
	} `json:"exported"`
	Failed []struct {
		Item  string `json:"item"`
		Error string `json:"error"`
	} `json:"failed"`
}

func (Summarize) Kind() string  { return "summarize" }
func (Summarize) Queue() string { return "nightly" }

// A workflow built in Go: a listing step, a fan-out with one job per file,
// and a fan-in that runs whatever happened and receives what succeeded and
// what failed. The run fails — one file could not be exported — and keeps
// that file's failure for a retry of it alone (RetryFailedWorkflowRun).
func ExampleNewWorkflow() {
	nc, stop := startDevFleet()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	a, err := agent.New(nc, agent.Config{Queues: []string{"nightly"}})
	if err != nil {
		panic(err)
	}
	_ = agent.AddHandler(a, func(ctx context.Context, _ *agent.Job, _ ListFiles) error {
		return agent.RecordResult(ctx, map[string]any{"files": []string{"a.csv", "broken.csv", "c.csv"}})
	})
	_ = agent.AddHandler(a, func(_ context.Context, _ *agent.Job, f ExportFile) error {
		if strings.HasPrefix(f.File, "broken") {
			return agent.NonRetryable(errors.New("unreadable"))
		}
		return nil
	})
	_ = agent.AddHandler(a, func(_ context.Context, _ *agent.Job, s Summarize) error {
		fmt.Printf("exported %d files, failed:", len(s.Exported))
		for _, f := range s.Failed {
			fmt.Printf(" %s (%s)", f.Item, f.Error)
		}
		fmt.Println()
		return nil
	})
	if err := a.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = a.Stop(ctx) }()

	wf := jetfleet.NewWorkflow("nightly-export")
	list := jetfleet.StepFor[ListFiles](wf, "list")
	export := jetfleet.StepFor[ExportFile](wf, "export").After(list).
		ForEach("{{steps.list.result.files}}").Parallelism(2).Attempts(1).
		Input(map[string]any{"file": "{{item}}"})
	jetfleet.StepFor[Summarize](wf, "summarize").After(export).When(protocol.WhenAlways).
		Input(map[string]any{"exported": "{{steps.export.succeeded}}", "failed": "{{steps.export.failed}}"})
	def, err := wf.Definition()
	if err != nil {
		panic(err)
	}

	client := jetfleet.NewClient(nc)
	if _, err := client.AddWorkflow(ctx, def); err != nil {
		panic(err)
	}
	started, err := client.RunWorkflow(ctx, "nightly-export", nil, jetfleet.RunID("2026-11-26"))
	if err != nil {
		panic(err)
	}
	run, err := client.WaitWorkflowRun(ctx, started.RunID)
	if err != nil {
		panic(err)
	}
	fmt.Println("run", run.RunID, run.Status)
	for _, f := range run.Failures.Elements {
		fmt.Printf("to retry: %s element %d %s\n", f.Step, f.Index, f.Item)
	}
	// Output:
	// exported 2 files, failed: broken.csv (non_retryable: unreadable)
	// run 2026-11-26 failed
	// to retry: export element 1 "broken.csv"
}
