package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/agent"
)

// Queue is the queue of the workflow's Go steps (workflow.json); the exec
// agent serves export-file on its own queue, export-files, so that each
// agent pulls only jobs it runs.
const Queue = "export"

// Config configures the Go agent.
type Config struct {
	// Dir holds in/, the files to export, and out/<run>/, each run's exports
	// (written by export-file.sh) and report.
	Dir string
	// AgentID is unique in the fleet.
	AgentID string
}

// ListFiles are the arguments of the workflow's first step: the run's
// input, {"pattern":"*.csv"} in schedule.json.
type ListFiles struct {
	// Pattern selects files of in/ (filepath.Match). Defaults to *.csv.
	Pattern string `json:"pattern"`
}

// Kind implements jetfleet.Args.
func (ListFiles) Kind() string { return "list-files" }

// Queue implements jetfleet.QueueArgs.
func (ListFiles) Queue() string { return Queue }

// FileList is the result of list-files: the fan-out's list.
type FileList struct {
	Files []string `json:"files"`
}

// ExportReport are the arguments of the workflow's last step: what its
// fan-out step export returned, {{steps.export.succeeded}} and
// {{steps.export.failed}} (docs/protocol.md §8.1).
type ExportReport struct {
	Run       string         `json:"run"`
	Succeeded []ExportedFile `json:"succeeded"`
	Failed    []FailedFile   `json:"failed"`
}

// Kind implements jetfleet.Args.
func (ExportReport) Kind() string { return "export-report" }

// Queue implements jetfleet.QueueArgs.
func (ExportReport) Queue() string { return Queue }

// ExportedFile is an element of the fan-out that succeeded, with the result
// export-file.sh wrote to $JETFLEET_RESULT.
type ExportedFile struct {
	Index  int    `json:"index"`
	Item   string `json:"item"`
	Result struct {
		Rows    int  `json:"rows"`
		Skipped bool `json:"skipped"`
	} `json:"result"`
}

// FailedFile is an element of the fan-out that failed after its attempts.
type FailedFile struct {
	Index int    `json:"index"`
	Item  string `json:"item"`
	Error string `json:"error"`
}

// ReportResult is the result of export-report: the files by outcome.
type ReportResult struct {
	Run      string   `json:"run"`
	Exported []string `json:"exported"`
	Failed   []string `json:"failed"`
	Report   string   `json:"report"`
}

// plainName is what export-file.sh accepts as a file name or run id: no
// '/', so nothing escapes its directory.
var plainName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)

// NewAgent returns an agent on nc, not started, that runs list-files and
// export-report on queue export.
func NewAgent(nc *nats.Conn, cfg Config, logger *slog.Logger) (*agent.Agent, error) {
	if cfg.Dir == "" {
		return nil, errors.New("nightly-export: a directory is required")
	}
	a, err := agent.New(nc, agent.Config{ID: cfg.AgentID, Queues: []string{Queue}, Concurrency: 2}, agent.WithLogger(logger))
	if err != nil {
		return nil, err
	}
	h := handlers{dir: cfg.Dir, logger: logger}
	if err := agent.AddHandler(a, h.listFiles); err != nil {
		return nil, err
	}
	if err := agent.AddHandler(a, h.report); err != nil {
		return nil, err
	}
	return a, nil
}

type handlers struct {
	dir    string
	logger *slog.Logger
}

// listFiles lists the files of in/ that match the pattern, sorted. A name
// export-file.sh would refuse is left out and logged. Listing twice lists
// the same files: nothing to make idempotent.
func (h handlers) listFiles(ctx context.Context, _ *agent.Job, args ListFiles) error {
	pattern := args.Pattern
	if pattern == "" {
		pattern = "*.csv"
	}
	if _, err := filepath.Match(pattern, ""); err != nil || strings.Contains(pattern, "/") {
		return agent.NonRetryable(fmt.Errorf("pattern %q: want a file name pattern such as *.csv", pattern))
	}
	entries, err := os.ReadDir(filepath.Join(h.dir, "in"))
	if err != nil {
		return err // retried: the directory may be mounted by then
	}
	list := FileList{Files: []string{}}
	for _, e := range entries {
		if ok, _ := filepath.Match(pattern, e.Name()); !ok || !e.Type().IsRegular() {
			continue
		}
		if !plainName.MatchString(e.Name()) {
			h.logger.Warn("file left out: export-file takes letters, digits, '.', '_' and '-'", "file", e.Name())
			continue
		}
		list.Files = append(list.Files, e.Name())
	}
	slices.Sort(list.Files)
	h.logger.Info("listed files", "pattern", pattern, "files", len(list.Files))
	return agent.RecordResult(ctx, list)
}

// report writes out/<run>/report.txt and records the files by outcome. It
// replaces the report of an earlier round of the run (after retry-failed it
// runs again with the whole picture), through a temporary file renamed into
// place, so a second delivery writes the same report again.
func (h handlers) report(ctx context.Context, _ *agent.Job, args ExportReport) error {
	if !plainName.MatchString(args.Run) {
		return agent.NonRetryable(fmt.Errorf("run %q: want a run id", args.Run))
	}
	res := ReportResult{Run: args.Run, Exported: []string{}, Failed: []string{}}
	var b strings.Builder
	fmt.Fprintf(&b, "nightly export, run %s: %d of %d files exported\n", args.Run, len(args.Succeeded),
		len(args.Succeeded)+len(args.Failed))
	for _, f := range args.Succeeded {
		res.Exported = append(res.Exported, f.Item)
		fmt.Fprintf(&b, "exported  %s  %d rows\n", f.Item, f.Result.Rows)
	}
	for _, f := range args.Failed {
		res.Failed = append(res.Failed, f.Item)
		fmt.Fprintf(&b, "FAILED    %s  %s\n", f.Item, f.Error)
	}
	out := filepath.Join(h.dir, "out", args.Run)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	res.Report = filepath.Join(out, "report.txt")
	if err := writeFileAtomic(res.Report, []byte(b.String())); err != nil {
		return err
	}
	h.logger.Info("export report written", "run", args.Run, "exported", len(res.Exported), "failed", res.Failed,
		"report", res.Report)
	return agent.RecordResult(ctx, res)
}

// writeFileAtomic writes data to path through a temporary file in the same
// directory renamed over it: a reader sees the old report or the new one.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(f.Name()) }() // gone after the rename; cleans up after a failure
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
