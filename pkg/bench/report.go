package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Units of figures.
const (
	UnitRate  = "jobs/s"
	UnitRatio = "×"
	UnitMs    = "ms"
	UnitUs    = "µs"
	UnitS     = "s"
	UnitBytes = "B"
	// UnitWrites counts stored messages and removal tombstones per job
	// (writes.go).
	UnitWrites = "writes/job"
)

// Report is the outcome of a bench: every figure over the runs, and what
// they were measured on.
type Report struct {
	StartedAt time.Time `json:"started_at"`
	// Duration of the whole bench, in seconds.
	Duration float64 `json:"duration_s"`
	// Server says what the runs ran against.
	Server string `json:"server"`
	Host   Host   `json:"host"`
	Config Config `json:"config"`
	// Figures in the order the scenarios produced them.
	Figures []*Figure `json:"figures"`
	// Notes explain figures and skipped scenarios.
	Notes []string `json:"notes,omitempty"`
}

// Host describes the machine, including its load, which co-located
// benchmarks are sensitive to.
type Host struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	NumCPU     int    `json:"num_cpu"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	// LoadAvgStart and LoadAvgEnd are the 1, 5 and 15 minute load averages
	// when the bench started and ended (Linux; empty elsewhere).
	LoadAvgStart []float64 `json:"load_avg_start,omitempty"`
	LoadAvgEnd   []float64 `json:"load_avg_end,omitempty"`
}

// Figure is one measured quantity over the runs.
type Figure struct {
	Scenario string `json:"scenario"`
	// Name is stable (for scripts); Label is for people.
	Name  string `json:"name"`
	Label string `json:"label"`
	Unit  string `json:"unit"`
	// Values holds one value per run.
	Values []float64 `json:"values"`
	Min    float64   `json:"min"`
	Median float64   `json:"median"`
	Max    float64   `json:"max"`
	// Target is what the figure is held against, if anything; Met says
	// whether the median meets it.
	Target *Target `json:"target,omitempty"`
	Met    *bool   `json:"met,omitempty"`
}

// Target is a bound a figure should respect.
type Target struct {
	// AtLeast: the figure should be at least Value; otherwise at most.
	AtLeast bool    `json:"at_least"`
	Value   float64 `json:"value"`
}

func (t *Target) met(v float64) bool {
	if t.AtLeast {
		return v >= t.Value
	}
	return v <= t.Value
}

func (t *Target) format(unit string) string {
	op := "≤"
	if t.AtLeast {
		op = "≥"
	}
	return op + " " + formatValue(t.Value, unit)
}

// Figure returns the figure of scenario named name, or nil.
func (r *Report) Figure(scenario, name string) *Figure {
	for _, f := range r.Figures {
		if f.Scenario == scenario && f.Name == name {
			return f
		}
	}
	return nil
}

// add records the value of one run.
func (r *Report) add(scenario string, spec figureSpec, v float64) {
	f := r.Figure(scenario, spec.name)
	if f == nil {
		f = &Figure{Scenario: scenario, Name: spec.name, Label: spec.label, Unit: spec.unit, Target: spec.target}
		r.Figures = append(r.Figures, f)
	}
	f.Values = append(f.Values, v)
	sorted := slices.Clone(f.Values)
	slices.Sort(sorted)
	f.Min, f.Max, f.Median = sorted[0], sorted[len(sorted)-1], median(sorted)
	if f.Target != nil {
		met := f.Target.met(f.Median)
		f.Met = &met
	}
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func (r *Report) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as a table for people.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "jetfleet bench, %s\n%s, %d run(s) per scenario\n%s\n\n", r.StartedAt.Format(time.RFC3339), r.Server,
		r.Config.Runs, r.Host.describe())
	rows := [][]string{{"scenario", "figure", "min", "median", "max", "unit", "target (median)"}}
	last := ""
	for _, f := range r.Figures {
		scenario := f.Scenario
		if scenario == last {
			scenario = ""
		}
		last = f.Scenario
		target := ""
		if f.Target != nil {
			verdict := "met"
			if !*f.Met {
				verdict = "MISSED"
			}
			target = f.Target.format(f.Unit) + " " + verdict
		}
		rows = append(rows, []string{scenario, f.Label, formatValue(f.Min, f.Unit), formatValue(f.Median, f.Unit),
			formatValue(f.Max, f.Unit), f.Unit, target})
	}
	widths := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, cell := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	for _, row := range rows {
		var b strings.Builder
		for i, cell := range row {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			if i >= 2 && i <= 4 { // numbers, right-aligned
				b.WriteString(pad + cell)
			} else {
				b.WriteString(cell + pad)
			}
			if i < len(row)-1 {
				b.WriteString("  ")
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	_, err := fmt.Fprintf(w, "(bench took %s)\n", (time.Duration(r.Duration * float64(time.Second))).Round(100*time.Millisecond))
	return err
}

func (h Host) describe() string {
	s := fmt.Sprintf("%s/%s, %d CPUs, GOMAXPROCS %d, %s", h.GOOS, h.GOARCH, h.NumCPU, h.GOMAXPROCS, h.GoVersion)
	if len(h.LoadAvgStart) == 3 {
		s += fmt.Sprintf(", load average %.2f %.2f %.2f at start", h.LoadAvgStart[0], h.LoadAvgStart[1], h.LoadAvgStart[2])
	}
	if len(h.LoadAvgEnd) == 3 {
		s += fmt.Sprintf(", %.2f %.2f %.2f at end", h.LoadAvgEnd[0], h.LoadAvgEnd[1], h.LoadAvgEnd[2])
	}
	return s
}

// formatValue writes v for a table: rates with thousands separators,
// durations and ratios with two decimals.
func formatValue(v float64, unit string) string {
	switch unit {
	case UnitRate, UnitBytes:
		return thousands(int64(math.Round(v)))
	case UnitRatio:
		return strconv.FormatFloat(v, 'f', 2, 64) + "×"
	case UnitMs:
		if v >= 100 {
			return strconv.FormatFloat(v, 'f', 0, 64)
		}
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func hostInfo() Host {
	return Host{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion: runtime.Version(), LoadAvgStart: loadAvg()}
}

// loadAvg reads the load averages on Linux; nil elsewhere.
func loadAvg() []float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return nil
	}
	out := make([]float64, 3)
	for i := range out {
		if out[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return nil
		}
	}
	return out
}

// figureSpec describes a figure a scenario produces.
type figureSpec struct {
	name, label, unit string
	target            *Target
}
