package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// na marks a count a scenario does not measure; the table shows "-".
const na = -1

// row is one scenario's counts: one row of the table.
type row struct {
	scenario string
	// published: acknowledged job publishes, plus the (schedule, nominal
	// time) pairs a scenario's schedules had to fire in its range.
	published int
	// runOnce, runTwice: of those, executed exactly once, at least twice
	// (end lines in the effect files).
	runOnce, runTwice int
	// lost: acknowledged publishes never run and not dead-lettered.
	lost int
	// deadLetters: distinct jobs with a dead letter.
	deadLetters int
	// unaccounted: messages JetStream accepted that were neither run, nor
	// dead-lettered, nor pending where `jetfleet status` shows them.
	unaccounted int
	// falseMissed: (schedule, nominal time) pairs reported `missed` that ran.
	falseMissed int
	// dupFires, missedFires: pairs run twice as a first attempt; pairs in
	// range never run.
	dupFires, missedFires int
	// history, executions: the supervisor's history records against the
	// distinct finished executions (succeeded or dead).
	history, executions int
	// dupEvents: jobs with more than one stored `succeeded` or `dead`
	// event (a resent event stored twice).
	dupEvents int
	// maxConcurrency: the most executions one agent process ran at once;
	// concurrencyLimit: what each agent is configured for.
	maxConcurrency, concurrencyLimit int
	// notes are short facts for the table (resume times, reasons).
	notes []string
	// failures are the hard targets this row failed, one sentence each.
	failures []string
	// err: the scenario could not run to its end.
	err error
	// elapsed is the scenario's wall time, fleet start and stop included.
	elapsed time.Duration
}

func newRow(scenario string) *row {
	return &row{
		scenario: scenario, published: na, runOnce: na, runTwice: na, lost: na, deadLetters: na,
		unaccounted: na, falseMissed: na, dupFires: na, missedFires: na, history: na, executions: na,
		dupEvents: na, maxConcurrency: na, concurrencyLimit: na,
	}
}

func (r *row) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

func (r *row) fail(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

// judge adds the failures of the hard targets every scenario shares: zero
// lost, zero unaccounted, zero false missed, zero duplicate or missed fires,
// history equal to executions, one terminal event per job, concurrency
// within the configured limit.
// At-least-once duplicates (runTwice) are reported, never failed.
func (r *row) judge() {
	if r.err != nil {
		r.fail("did not complete: %v", r.err)
	}
	if r.lost > 0 {
		r.fail("%d acknowledged jobs lost (never run, not dead-lettered)", r.lost)
	}
	if r.unaccounted > 0 {
		r.fail("%d accepted messages unaccounted for (not run, not dead-lettered, not visibly pending)", r.unaccounted)
	}
	if r.falseMissed > 0 {
		r.fail("%d false `missed` (schedule, nominal time) pairs: reported missed, but they ran", r.falseMissed)
	}
	if r.dupFires > 0 {
		r.fail("%d (schedule, nominal time) pairs fired twice", r.dupFires)
	}
	if r.missedFires > 0 {
		r.fail("%d (schedule, nominal time) pairs in range never ran", r.missedFires)
	}
	if r.history != na && r.history != r.executions {
		r.fail("history holds %d records for %d finished executions", r.history, r.executions)
	}
	if r.dupEvents > 0 {
		r.fail("%d jobs have more than one stored succeeded or dead event", r.dupEvents)
	}
	if r.maxConcurrency != na && r.maxConcurrency > r.concurrencyLimit {
		r.fail("an agent ran %d executions at once, configured for %d", r.maxConcurrency, r.concurrencyLimit)
	}
}

func (r *row) passed() bool { return len(r.failures) == 0 }

var columns = []string{"scenario", "published", "run once", "run twice", "lost", "dead letters", "unaccounted",
	"false missed", "dup fires", "missed fires", "history / executions", "dup events", "max concurrency", "result", "notes"}

func count(n int) string {
	if n == na {
		return "-"
	}
	return strconv.Itoa(n)
}

func (r *row) cells() []string {
	hist := "-"
	if r.history != na {
		hist = fmt.Sprintf("%d / %d", r.history, r.executions)
	}
	conc := "-"
	if r.maxConcurrency != na {
		conc = fmt.Sprintf("%d / %d", r.maxConcurrency, r.concurrencyLimit)
	}
	result := "pass"
	if !r.passed() {
		result = "FAIL"
	}
	return []string{r.scenario, count(r.published), count(r.runOnce), count(r.runTwice), count(r.lost),
		count(r.deadLetters), count(r.unaccounted), count(r.falseMissed), count(r.dupFires), count(r.missedFires),
		hist, count(r.dupEvents), conc, result, strings.Join(r.notes, "; ")}
}

// printTable writes the rows as a Markdown table (aligned, so it reads in
// a terminal and pastes into docs/reliability.md), then every failure.
func printTable(w io.Writer, rows []*row) {
	table := [][]string{columns}
	for _, r := range rows {
		table = append(table, r.cells())
	}
	widths := make([]int, len(columns))
	for _, cells := range table {
		for i, c := range cells[:len(cells)-1] { // the notes are not padded
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range cells {
			pad := 0
			if i < len(cells)-1 {
				pad = widths[i] - len([]rune(c))
			}
			b.WriteString(" " + c + strings.Repeat(" ", pad) + " |")
		}
		fmt.Fprintln(w, b.String())
	}
	line(table[0])
	sep := make([]string, len(columns))
	for i := range sep {
		sep[i] = strings.Repeat("-", max(widths[i], 3))
	}
	line(sep)
	for _, cells := range table[1:] {
		line(cells)
	}
	for _, r := range rows {
		for _, f := range r.failures {
			fmt.Fprintf(w, "FAIL %s: %s\n", r.scenario, f)
		}
	}
}
