package dashboard

import (
	"context"
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Charts are SVG drawn on the server from the supervisor's trend buckets:
// no JavaScript, no library, readable without CSS (each bar and point has
// a title), and small enough to send again on every live refresh.

type charts struct {
	Runs      template.HTML
	Durations template.HTML
	// Points counts the buckets with runs; Span says what the charts cover.
	Points int
	Span   string
}

const (
	chartW, chartH = 720.0, 150.0
	padL, padB     = 44.0, 20.0
)

// trendCharts reads a series' buckets at res (m: the last 3 hours by
// minute; h: the last 7 days by hour) and draws them.
func (d *Dashboard) trendCharts(ctx context.Context, req jetfleet.TrendsRequest, res string, now time.Time) (*jetfleet.TrendsResponse, charts) {
	if res == "" {
		res = protocol.TrendMinute
	}
	step, n := time.Minute, 180
	if res == protocol.TrendHour {
		step, n = time.Hour, 168
	}
	end := now.UTC().Truncate(step).Add(step)
	start := end.Add(-time.Duration(n) * step)
	req.Resolution, req.Since = res, start
	tr, err := d.client.Trends(ctx, req)
	if err != nil {
		return nil, charts{}
	}
	slots := make([]*jetfleet.TrendBucket, n)
	pts := 0
	for i := range tr.Buckets {
		b := &tr.Buckets[i]
		k := int(b.Start.Sub(start) / step)
		if k >= 0 && k < n {
			slots[k] = b
			if b.Runs > 0 {
				pts++
			}
		}
	}
	span := "last 3 hours, per minute"
	if res == protocol.TrendHour {
		span = "last 7 days, per hour"
	}
	return tr, charts{Runs: runsChart(slots, start, step), Durations: durationChart(slots, start, step), Points: pts, Span: span}
}

func label(t time.Time, step time.Duration) string {
	if step >= time.Hour {
		return t.UTC().Format("Jan 2 15:04")
	}
	return t.UTC().Format("15:04")
}

func runsChart(slots []*jetfleet.TrendBucket, start time.Time, step time.Duration) template.HTML {
	maxRuns := 1
	for _, b := range slots {
		if b != nil && b.Runs > maxRuns {
			maxRuns = b.Runs
		}
	}
	n := len(slots)
	bw := (chartW - padL) / float64(n)
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-labelledby="runs-title" data-points="%d">`, chartW, chartH, countRuns(slots))
	fmt.Fprintf(&sb, `<title id="runs-title">Runs per %s: succeeded and dead</title>`, stepWord(step))
	axes(&sb, float64(maxRuns), "", slots, start, step)
	plotH := chartH - padB - 8
	for i, b := range slots {
		if b == nil || b.Runs == 0 {
			continue
		}
		x := padL + float64(i)*bw
		hOK := plotH * float64(b.Succeeded) / float64(maxRuns)
		hDead := plotH * float64(b.Dead) / float64(maxRuns)
		base := chartH - padB
		title := template.HTMLEscapeString(fmt.Sprintf("%s: %d runs, %d succeeded, %d dead, %d retried attempts",
			label(start.Add(time.Duration(i)*step), step), b.Runs, b.Succeeded, b.Dead, b.AttemptFailures))
		fmt.Fprintf(&sb, `<g class="bar"><title>%s</title>`, title)
		if hOK > 0 {
			fmt.Fprintf(&sb, `<rect class="ok" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, x, base-hOK, max(bw-0.6, 0.8), hOK)
		}
		if hDead > 0 {
			fmt.Fprintf(&sb, `<rect class="dead" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, x, base-hOK-hDead, max(bw-0.6, 0.8), hDead)
		}
		sb.WriteString(`</g>`)
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

func countRuns(slots []*jetfleet.TrendBucket) int {
	n := 0
	for _, b := range slots {
		if b != nil && b.Runs > 0 {
			n++
		}
	}
	return n
}

func stepWord(step time.Duration) string {
	if step >= time.Hour {
		return "hour"
	}
	return "minute"
}

func durationChart(slots []*jetfleet.TrendBucket, start time.Time, step time.Duration) template.HTML {
	var maxD time.Duration
	for _, b := range slots {
		if b == nil || b.Runs == 0 {
			continue
		}
		maxD = max(maxD, b.P95(), b.DelayP95())
	}
	if maxD == 0 {
		maxD = time.Second
	}
	n := len(slots)
	bw := (chartW - padL) / float64(n)
	plotH := chartH - padB - 8
	y := func(d time.Duration) float64 { return chartH - padB - plotH*float64(d)/float64(maxD) }
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-labelledby="dur-title" data-points="%d">`, chartW, chartH, countRuns(slots))
	fmt.Fprintf(&sb, `<title id="dur-title">Duration p50 and p95, and scheduling delay p95, per %s</title>`, stepWord(step))
	axes(&sb, float64(maxD), "dur", slots, start, step)
	for _, line := range []struct {
		class string
		v     func(*jetfleet.TrendBucket) time.Duration
	}{{"p50", (*jetfleet.TrendBucket).P50}, {"p95", (*jetfleet.TrendBucket).P95}, {"delay", (*jetfleet.TrendBucket).DelayP95}} {
		// A line joins adjacent buckets only: a gap (no run) breaks it.
		var pts []string
		flush := func() {
			if len(pts) > 1 {
				fmt.Fprintf(&sb, `<polyline class="%s" points="%s"/>`, line.class, strings.Join(pts, " "))
			}
			pts = pts[:0]
		}
		for i, b := range slots {
			if b == nil || b.Runs == 0 || (line.class == "delay" && b.Delays.Count() == 0) {
				flush()
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", padL+(float64(i)+0.5)*bw, y(line.v(b))))
		}
		flush()
		for i, b := range slots {
			if b == nil || b.Runs == 0 || (line.class == "delay" && b.Delays.Count() == 0) {
				continue
			}
			fmt.Fprintf(&sb, `<circle class="%s" cx="%.1f" cy="%.1f" r="2"><title>%s</title></circle>`, line.class,
				padL+(float64(i)+0.5)*bw, y(line.v(b)), template.HTMLEscapeString(fmt.Sprintf("%s %s: %s",
					label(start.Add(time.Duration(i)*step), step), line.class, fmtDur(line.v(b)))))
		}
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

// axes draws the frame, three value ticks and four time labels.
func axes(sb *strings.Builder, maxV float64, unit string, slots []*jetfleet.TrendBucket, start time.Time, step time.Duration) {
	base := chartH - padB
	plotH := base - 8
	fmt.Fprintf(sb, `<line class="axis" x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/>`, padL, base, chartW, base)
	for _, f := range []float64{0.5, 1} {
		yy := base - plotH*f
		v := maxV * f
		text := fmt.Sprintf("%.0f", v)
		if unit == "dur" {
			text = fmtDur(time.Duration(v))
		}
		fmt.Fprintf(sb, `<line class="grid" x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f"/><text class="tick" x="%.0f" y="%.1f">%s</text>`,
			padL, yy, chartW, yy, padL-4, yy+4, template.HTMLEscapeString(text))
	}
	n := len(slots)
	bw := (chartW - padL) / float64(n)
	for _, k := range []int{0, n / 3, 2 * n / 3, n} {
		class := "tlabel"
		if k == n {
			class = "tlabel end" // the end of the span, at the right edge
		}
		fmt.Fprintf(sb, `<text class="%s" x="%.1f" y="%.0f">%s</text>`, class, padL+float64(k)*bw, chartH-4,
			template.HTMLEscapeString(label(start.Add(time.Duration(k)*step), step)))
	}
}
