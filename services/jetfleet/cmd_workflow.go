package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

func init() {
	register(&command{name: "workflow", summary: "manage workflows and their runs: workflow add|ls|show|rm|run|runs|get|retry-failed|cancel", subs: []*command{
		{name: "add", args: "-f <file|->", summary: "Store a workflow definition, JSON or YAML (a new workflow, or a new version of one).",
			help: "The file is YAML when its name ends in .yaml or .yml, JSON when it ends in .json, and else judged by its\n" +
				"content; '-' reads standard input. YAML is converted to JSON before it is sent: map keys must be\n" +
				"strings, numbers are kept exactly as written. The supervisor validates the definition and names the\n" +
				"step and the field at fault. Runs already started keep the version they started with.",
			setup: setupWorkflowAdd},
		{name: "ls", summary: "List the stored workflows.", setup: setupWorkflowList},
		{name: "show", args: "<name>", summary: "Print a workflow's definition as JSON (-o json: with its name, revision and update time).",
			setup: setupWorkflowShow},
		{name: "rm", args: "<name>", summary: "Remove a workflow's definition; its runs go on.", setup: setupWorkflowRemove},
		{name: "run", args: "<name>", summary: "Start a run of a workflow and print its run id; with -wait, wait for it to end.",
			help: "With -id, a second start with the same run id starts nothing and says duplicate. With -wait, the run\n" +
				"is printed as 'workflow get' prints it once it ended, and a run that failed or was cancelled exits\n" +
				"with status 1. -timeout bounds each request to the fleet, -wait-timeout the whole wait.",
			setup: setupWorkflowRun},
		{name: "runs", summary: "List workflow runs, newest first.", setup: setupWorkflowRuns},
		{name: "get", args: "<run_id>", summary: "Print a run: its status, each step's, and the fan-out elements that failed.",
			setup: setupWorkflowGet},
		{name: "retry-failed", args: "<run_id>",
			summary: "Run again only what failed in a run (failed steps and fan-out elements), then what depends on it.",
			setup:   setupWorkflowRetryFailed},
		{name: "cancel", args: "<run_id>", summary: "Cancel a run: its queued and running jobs are cancelled and nothing more starts.",
			setup: setupWorkflowCancel},
	}})
	for _, c := range root.sub("workflow").subs {
		c.fleet, c.output = true, true
	}
}

const (
	workflowName = "the workflow <name>"
	runIDArg     = "the <run_id>"
	// defaultWaitTimeout bounds workflow run -wait.
	defaultWaitTimeout = 10 * time.Minute
)

// workflowRunStatuses are the values of workflow runs -status.
var workflowRunStatuses = []string{jetfleet.WorkflowRunning, jetfleet.WorkflowSucceeded, jetfleet.WorkflowFailed, jetfleet.WorkflowCancelled}

func setupWorkflowAdd(fs *flag.FlagSet) action {
	file := fs.String("f", "", "read the definition from `file`, JSON or YAML ('-' for standard input)")
	return func(ctx context.Context, inv *invocation) error {
		if len(inv.args) > 0 {
			return usageErrorf(inv.cmd, "workflow add takes no arguments, got %q: the definition, its name included, is read from -f <file>", inv.args)
		}
		if *file == "" {
			return usageErrorf(inv.cmd, "workflow add needs -f <file> (JSON or YAML; '-' for standard input)")
		}
		doc, err := readDocument(inv, "f", *file)
		if err != nil {
			return err
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			info, err := api.AddWorkflowDocument(ctx, doc)
			if err != nil {
				return err
			}
			return inv.print(info, func(out io.Writer) error {
				_, err := fmt.Fprintf(out, "workflow %s stored (revision %d, %s)\n", info.Name, info.Revision, plural(info.Steps, "step"))
				return err
			})
		})
	}
}

func setupWorkflowList(*flag.FlagSet) action {
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			list, err := api.Workflows(ctx)
			if err != nil {
				return err
			}
			if list == nil {
				list = []jetfleet.WorkflowInfo{}
			}
			return inv.print(list, func(out io.Writer) error { return printWorkflows(out, list) })
		})
	}
}

func printWorkflows(out io.Writer, list []jetfleet.WorkflowInfo) error {
	if len(list) == 0 {
		_, err := fmt.Fprintln(out, "no workflows")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTEPS\tREVISION\tUPDATED\tDESCRIPTION")
	for _, w := range list {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", w.Name, w.Steps, w.Revision, formatTime(w.Updated), dash(truncate(firstLine(w.Description), 60)))
	}
	return tw.Flush()
}

// oneArg is the action of a workflow command that takes one argument,
// named what, and nothing else.
func oneArg(what string, fn func(ctx context.Context, inv *invocation, api *jetfleet.Client, arg string) error) action {
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(1, what); err != nil {
			return err
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error { return fn(ctx, inv, api, inv.args[0]) })
	}
}

func setupWorkflowShow(*flag.FlagSet) action {
	return oneArg(workflowName, func(ctx context.Context, inv *invocation, api *jetfleet.Client, name string) error {
		info, err := api.Workflow(ctx, name)
		if err != nil {
			return err
		}
		return inv.print(info, func(out io.Writer) error {
			if info.Definition == nil {
				return fmt.Errorf("workflow %s: the supervisor sent no definition", name)
			}
			return printJSON(out, info.Definition)
		})
	})
}

func setupWorkflowRemove(*flag.FlagSet) action {
	return oneArg(workflowName, func(ctx context.Context, inv *invocation, api *jetfleet.Client, name string) error {
		if err := api.RemoveWorkflow(ctx, name); err != nil {
			return err
		}
		return inv.print(jetfleet.WorkflowNameRequest{Name: name}, func(out io.Writer) error {
			_, err := fmt.Fprintf(out, "workflow %s removed\n", name)
			return err
		})
	})
}

func setupWorkflowRun(fs *flag.FlagSet) action {
	input := fs.String("input", "", "the run's input, a JSON `value` (templates read it as {{input…}})")
	inputFile := fs.String("input-file", "", "read the run's input from `file`, JSON or YAML ('-' for standard input)")
	runID := fs.String("id", "", "run `id`, also the idempotency key (default one the supervisor makes)")
	wait := fs.Bool("wait", false, "wait for the run to end and print it; exit status 1 if it failed or was cancelled")
	waitTimeout := fs.Duration("wait-timeout", defaultWaitTimeout, "with -wait, how long to wait for the run to end")
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(1, workflowName); err != nil {
			return err
		}
		var in any // nil: no input
		switch {
		case *input != "" && *inputFile != "":
			return flagValueErrorf("give -input or -input-file, not both")
		case *input != "":
			if !json.Valid([]byte(*input)) {
				return flagValueErrorf("-input is not JSON: %s", *input)
			}
			in = json.RawMessage(*input)
		case *inputFile != "":
			doc, err := readDocument(inv, "input-file", *inputFile)
			if err != nil {
				return err
			}
			in = json.RawMessage(doc)
		}
		if *waitTimeout <= 0 {
			return flagValueErrorf("-wait-timeout %s is not positive", *waitTimeout)
		}
		var opts []jetfleet.RunOption
		if *runID != "" {
			opts = append(opts, jetfleet.RunID(*runID))
		}
		c, api, err := inv.connectAPI()
		if err != nil {
			return err
		}
		defer c.close()
		rctx, cancel := c.ctx(ctx)
		res, err := api.RunWorkflow(rctx, inv.args[0], in, opts...)
		cancel()
		if err != nil {
			return err
		}
		if !*wait {
			return inv.print(res, func(out io.Writer) error { return printRunStarted(out, inv.args[0], res) })
		}
		if inv.format != "json" {
			if err := printRunStarted(inv.out, inv.args[0], res); err != nil {
				return err
			}
		}
		wctx, cancel := context.WithTimeout(ctx, *waitTimeout)
		defer cancel()
		run, err := api.WaitWorkflowRun(wctx, res.RunID)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return fmt.Errorf("run %s did not end within -wait-timeout %s; see 'jetfleet workflow get %s'", res.RunID, *waitTimeout, res.RunID)
			}
			return fmt.Errorf("waiting for run %s: %w", res.RunID, err)
		}
		if inv.format != "json" {
			fmt.Fprintln(inv.out)
		}
		err = inv.print(run, func(out io.Writer) error { return printWorkflowRun(out, run) })
		return errors.Join(err, runOutcome(run))
	}
}

func printRunStarted(out io.Writer, workflow string, res *jetfleet.WorkflowRunResponse) error {
	if res.Duplicate {
		_, err := fmt.Fprintf(out, "duplicate: run %s of workflow %s was already started (status %s); not started again\n",
			res.RunID, workflow, res.Status)
		return err
	}
	_, err := fmt.Fprintf(out, "started run %s of workflow %s\n", res.RunID, workflow)
	return err
}

// runOutcome is the error of a run that ended without succeeding: workflow
// run -wait exits with status 1 then.
func runOutcome(run *jetfleet.WorkflowRunDetail) error {
	switch run.Status {
	case jetfleet.WorkflowFailed:
		return fmt.Errorf("run %s of workflow %s failed: %s failed", run.RunID, run.Workflow, failedCounts(run.FailedSteps, run.FailedElements))
	case jetfleet.WorkflowCancelled:
		return fmt.Errorf("run %s of workflow %s was cancelled", run.RunID, run.Workflow)
	}
	return nil
}

func setupWorkflowRuns(fs *flag.FlagSet) action {
	var req jetfleet.WorkflowRunsRequest
	fs.StringVar(&req.Workflow, "workflow", "", "only runs of this workflow `name`")
	fs.StringVar(&req.Status, "status", "", "only runs in this `status`: "+orList(workflowRunStatuses))
	fs.IntVar(&req.Limit, "limit", 0, fmt.Sprintf("most runs to list (default 100, at most %d)", jetfleet.MaxWorkflowRunsLimit))
	return func(ctx context.Context, inv *invocation) error {
		if err := inv.wantArgs(0); err != nil {
			return err
		}
		if req.Status != "" && !slices.Contains(workflowRunStatuses, req.Status) {
			return flagValueErrorf("-status %q: want %s", req.Status, orList(workflowRunStatuses))
		}
		if req.Limit < 0 || req.Limit > jetfleet.MaxWorkflowRunsLimit {
			return flagValueErrorf("-limit %d: want 1 to %d", req.Limit, jetfleet.MaxWorkflowRunsLimit)
		}
		return inv.withAPI(ctx, func(ctx context.Context, api *jetfleet.Client) error {
			runs, err := api.WorkflowRuns(ctx, req)
			if err != nil {
				return err
			}
			if runs == nil {
				runs = []jetfleet.WorkflowRunSummary{}
			}
			return inv.print(runs, func(out io.Writer) error { return printWorkflowRuns(out, runs) })
		})
	}
}

func printWorkflowRuns(out io.Writer, runs []jetfleet.WorkflowRunSummary) error {
	if len(runs) == 0 {
		_, err := fmt.Fprintln(out, "no workflow runs")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tWORKFLOW\tSTATUS\tROUND\tSTARTED\tENDED\tFAILED")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.RunID, r.Workflow, r.Status, r.Round, formatTime(r.StartedAt),
			timeOrDash(utcOrNil(r.EndedAt)), failedCounts(r.FailedSteps, r.FailedElements))
	}
	return tw.Flush()
}

func setupWorkflowGet(*flag.FlagSet) action {
	return oneArg(runIDArg, func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error {
		run, err := api.WorkflowRun(ctx, id)
		if err != nil {
			return err
		}
		return inv.print(run, func(out io.Writer) error { return printWorkflowRun(out, run) })
	})
}

func setupWorkflowRetryFailed(*flag.FlagSet) action {
	return oneArg(runIDArg, func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error {
		run, err := api.RetryFailedWorkflowRun(ctx, id)
		if err != nil {
			return err
		}
		return inv.print(run, func(out io.Writer) error {
			_, err := fmt.Fprintf(out, "run %s of workflow %s: retrying its failed work (round %d), status %s\n", run.RunID, run.Workflow,
				run.Round, run.Status)
			return err
		})
	})
}

func setupWorkflowCancel(*flag.FlagSet) action {
	return oneArg(runIDArg, func(ctx context.Context, inv *invocation, api *jetfleet.Client, id string) error {
		run, err := api.CancelWorkflowRun(ctx, id)
		if err != nil {
			return err
		}
		return inv.print(run, func(out io.Writer) error {
			_, err := fmt.Fprintf(out, "run %s of workflow %s: %s\n", run.RunID, run.Workflow, run.Status)
			return err
		})
	})
}

// maxItemShown is how much of a failed element's item workflow get prints.
const maxItemShown = 60

// printWorkflowRun prints a run: a header one field a line, its steps, and
// the fan-out elements that failed.
func printWorkflowRun(out io.Writer, run *jetfleet.WorkflowRunDetail) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RUN\t%s\n", run.RunID)
	fmt.Fprintf(tw, "WORKFLOW\t%s\n", run.Workflow)
	status := run.Status
	if run.Status != jetfleet.WorkflowCancelled && (run.FailedSteps > 0 || run.FailedElements > 0) {
		status += " (" + failedCounts(run.FailedSteps, run.FailedElements) + " failed)"
	}
	fmt.Fprintf(tw, "STATUS\t%s\n", status)
	fmt.Fprintf(tw, "ROUND\t%d\n", run.Round)
	fmt.Fprintf(tw, "STARTED\t%s\n", formatTime(run.StartedAt))
	fmt.Fprintf(tw, "ENDED\t%s\n", timeOrDash(utcOrNil(run.EndedAt)))
	if run.JobID != "" {
		fmt.Fprintf(tw, "JOB\t%s\n", run.JobID)
	}
	if run.ScheduleID != "" {
		fmt.Fprintf(tw, "SCHEDULE\t%s\n", run.ScheduleID)
	}
	if run.Error != "" {
		fmt.Fprintf(tw, "ERROR\t%s\n", run.Error)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(run.Steps) > 0 {
		fmt.Fprintln(out)
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STEP\tKIND\tQUEUE\tSTATUS\tTOOK\tELEMENTS\tERROR")
		for _, s := range run.Steps {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Kind, dash(s.Queue), s.Status, stepTook(s),
				elementCounts(s.Elements), dash(truncate(firstLine(s.Error), 60)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(run.Failures.Elements) > 0 {
		fmt.Fprintln(out, "\nFAILED ELEMENTS")
		tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STEP\tINDEX\tITEM\tJOB\tERROR")
		for _, e := range run.Failures.Elements {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", e.Step, e.Index, compactJSON(e.Item, maxItemShown), e.JobID,
				dash(truncate(firstLine(e.Error), 60)))
		}
		return tw.Flush()
	}
	return nil
}

// stepTook is how long an ended step took, "-" for one that has not ended.
func stepTook(s jetfleet.WorkflowStepView) string {
	if s.StartedAt == nil || s.EndedAt == nil {
		return "-"
	}
	return s.EndedAt.Sub(*s.StartedAt).Round(time.Millisecond).String()
}

// elementStatusOrder is the order a fan-out's counts are printed in.
var elementStatusOrder = []string{jetfleet.WorkflowSucceeded, jetfleet.WorkflowFailed, jetfleet.WorkflowCancelled,
	jetfleet.WorkflowRunning, jetfleet.WorkflowWaiting, jetfleet.WorkflowSkipped}

// elementCounts writes a fan-out's elements by status, "97 succeeded, 3
// failed", or "-" for a step that is not a fan-out.
func elementCounts(counts map[string]int) string {
	var parts []string
	for _, status := range elementStatusOrder {
		if n := counts[status]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, status))
		}
	}
	var others []string // statuses this CLI does not know yet, by name
	for status, n := range counts {
		if n > 0 && !slices.Contains(elementStatusOrder, status) {
			others = append(others, status)
		}
	}
	slices.Sort(others)
	for _, status := range others {
		parts = append(parts, fmt.Sprintf("%d %s", counts[status], status))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// failedCounts writes "2 steps, 3 elements", or "-" when nothing failed.
func failedCounts(steps, elements int) string {
	var parts []string
	if steps > 0 {
		parts = append(parts, plural(steps, "step"))
	}
	if elements > 0 {
		parts = append(parts, plural(elements, "element"))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// compactJSON writes a JSON value on one line, at most n characters.
func compactJSON(raw json.RawMessage, n int) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "-"
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return truncate(strings.Join(strings.Fields(string(raw)), " "), n)
	}
	return truncate(b.String(), n)
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func utcOrNil(t *time.Time) *time.Time {
	if t == nil || t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}
