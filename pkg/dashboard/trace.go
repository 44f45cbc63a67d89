package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// The trace of a run, drawn from Jaeger's query API
// (GET <query_url>/api/traces/<trace id>) as a waterfall: one row per span,
// indented under its parent, its bar placed on the trace's time line.

type waterfall struct {
	TraceID  string
	Duration time.Duration
	Spans    []spanRow
}

type spanRow struct {
	Service   string
	Operation string
	Depth     int
	Start     time.Duration // from the trace's start
	Duration  time.Duration
	// Left and Width place the bar, in percent of the trace.
	Left, Width float64
	Error       bool
	Tags        string
}

type jaegerTrace struct {
	Data []struct {
		TraceID string `json:"traceID"`
		Spans   []struct {
			SpanID        string `json:"spanID"`
			OperationName string `json:"operationName"`
			References    []struct {
				RefType string `json:"refType"`
				SpanID  string `json:"spanID"`
			} `json:"references"`
			StartTime int64  `json:"startTime"` // µs since the epoch
			Duration  int64  `json:"duration"`  // µs
			ProcessID string `json:"processID"`
			Tags      []struct {
				Key   string `json:"key"`
				Value any    `json:"value"`
			} `json:"tags"`
		} `json:"spans"`
		Processes map[string]struct {
			ServiceName string `json:"serviceName"`
		} `json:"processes"`
	} `json:"data"`
}

// fetchTrace reads a trace from Jaeger; an error says why it is not drawn.
func (d *Dashboard) fetchTrace(ctx context.Context, traceID string) (*waterfall, error) {
	u := strings.TrimRight(d.cfg.Jaeger.QueryURL, "/") + "/api/traces/" + url.PathEscape(traceID)
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Jaeger.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	res, err := d.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("Jaeger is not reachable: %v", err)
	}
	defer func() { _ = res.Body.Close() }() // read, or given up on: nothing to report on close
	if res.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("Jaeger has no trace %s (yet)", traceID)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("Jaeger answered %s", res.Status)
	}
	var jt jaegerTrace
	if err := json.NewDecoder(http.MaxBytesReader(nil, res.Body, 8<<20)).Decode(&jt); err != nil {
		return nil, fmt.Errorf("Jaeger's answer cannot be read: %v", err)
	}
	if len(jt.Data) == 0 || len(jt.Data[0].Spans) == 0 {
		return nil, fmt.Errorf("Jaeger has no span of trace %s (yet)", traceID)
	}
	return buildWaterfall(jt), nil
}

func buildWaterfall(jt jaegerTrace) *waterfall {
	t := jt.Data[0]
	parent := map[string]string{}
	byID := map[string]int{}
	var start, end int64
	for i, s := range t.Spans {
		byID[s.SpanID] = i
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" || parent[s.SpanID] == "" {
				parent[s.SpanID] = r.SpanID
			}
		}
		if i == 0 || s.StartTime < start {
			start = s.StartTime
		}
		end = max(end, s.StartTime+s.Duration)
	}
	children := map[string][]int{}
	var roots []int
	for i, s := range t.Spans {
		p, ok := parent[s.SpanID]
		if _, known := byID[p]; ok && known {
			children[p] = append(children[p], i)
		} else {
			roots = append(roots, i)
		}
	}
	byStart := func(ix []int) {
		sort.Slice(ix, func(a, b int) bool { return t.Spans[ix[a]].StartTime < t.Spans[ix[b]].StartTime })
	}
	total := max(end-start, 1)
	w := &waterfall{TraceID: t.TraceID, Duration: time.Duration(total) * time.Microsecond}
	var walk func(i, depth int)
	seen := map[int]bool{}
	walk = func(i, depth int) {
		if seen[i] || len(w.Spans) >= 500 {
			return
		}
		seen[i] = true
		s := t.Spans[i]
		row := spanRow{Service: t.Processes[s.ProcessID].ServiceName, Operation: s.OperationName, Depth: depth,
			Start: time.Duration(s.StartTime-start) * time.Microsecond, Duration: time.Duration(s.Duration) * time.Microsecond,
			Left: 100 * float64(s.StartTime-start) / float64(total), Width: max(100*float64(s.Duration)/float64(total), 0.3)}
		var tags []string
		for _, tag := range s.Tags {
			if tag.Key == "error" && fmt.Sprint(tag.Value) == "true" || tag.Key == "otel.status_code" && fmt.Sprint(tag.Value) == "ERROR" {
				row.Error = true
			}
			if strings.HasPrefix(tag.Key, "jetfleet.") || strings.HasPrefix(tag.Key, "messaging.") {
				tags = append(tags, fmt.Sprintf("%s=%v", tag.Key, tag.Value))
			}
		}
		row.Tags = strings.Join(tags, " ")
		w.Spans = append(w.Spans, row)
		kids := children[s.SpanID]
		byStart(kids)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	byStart(roots)
	for _, r := range roots {
		walk(r, 0)
	}
	return w
}

// SVG draws the waterfall: a row per span, its name indented under its
// parent, its bar on the trace's time line (SVG, so that it needs neither
// script nor inline styles).
func (w *waterfall) SVG() template.HTML {
	const rowH, nameW, width = 22.0, 300.0, 960.0
	trackW := width - nameW - 70
	h := rowH*float64(len(w.Spans)) + 24
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="waterfall" viewBox="0 0 %.0f %.0f" role="img" aria-labelledby="wf-title" data-spans="%d">`, width, h, len(w.Spans))
	fmt.Fprintf(&sb, `<title id="wf-title">%s</title>`, template.HTMLEscapeString(fmt.Sprintf("Trace %s: %d spans over %s", w.TraceID, len(w.Spans), fmtDur(w.Duration))))
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		x := nameW + f*trackW
		fmt.Fprintf(&sb, `<line class="grid" x1="%.1f" y1="0" x2="%.1f" y2="%.0f"/><text class="tick" x="%.1f" y="%.0f">%s</text>`,
			x, x, h-16, x, h-4, template.HTMLEscapeString(fmtDur(time.Duration(f*float64(w.Duration)))))
	}
	for i, s := range w.Spans {
		y := float64(i) * rowH
		class := "span"
		if s.Error {
			class += " span-error"
		}
		name := s.Operation
		if s.Service != "" {
			name = s.Service + ": " + s.Operation
		}
		fmt.Fprintf(&sb, `<g class="%s"><title>%s</title>`, class, template.HTMLEscapeString(fmt.Sprintf("%s — starts at %s, lasts %s %s",
			name, fmtDur(s.Start), fmtDur(s.Duration), s.Tags)))
		fmt.Fprintf(&sb, `<text class="span-name" x="%.0f" y="%.1f">%s</text>`, 4+12*float64(min(s.Depth, 12)), y+15,
			template.HTMLEscapeString(shorten(name, 44-min(s.Depth, 12))))
		x := nameW + trackW*s.Left/100
		fmt.Fprintf(&sb, `<rect class="span-bar" x="%.1f" y="%.1f" width="%.1f" height="%.0f" rx="2"/>`, x, y+4, max(trackW*s.Width/100, 1.5), rowH-8)
		fmt.Fprintf(&sb, `<text class="span-dur" x="%.1f" y="%.1f">%s</text></g>`, x+max(trackW*s.Width/100, 1.5)+4, y+15,
			template.HTMLEscapeString(fmtDur(s.Duration)))
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}
