package jetfleet

import (
	"context"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// The supervisor's trends (jetfleet.api.supervisor.trends and .trends.ls):
// time-bucketed rollups per job kind and per schedule, and each series'
// verdict — degrading when its recent window departs from its own baseline.

// Histogram counts durations in logarithmic bins, four per doubling (each
// bin spans ~19%), from 1µs up: small, mergeable, and its quantiles are
// within ~10% of the true value. The key is the bin number.
type Histogram map[int]uint32

// histBin is the bin of d.
func histBin(d time.Duration) int {
	us := float64(d) / float64(time.Microsecond)
	if us < 1 {
		return 0
	}
	return int(math.Floor(math.Log2(us)*4)) + 1
}

// binValue is the middle of bin b.
func binValue(b int) time.Duration {
	if b <= 0 {
		return 0
	}
	return time.Duration(math.Exp2((float64(b-1)+0.5)/4) * float64(time.Microsecond))
}

// Add counts d once.
func (h Histogram) Add(d time.Duration) { h[histBin(d)]++ }

// Merge adds o's counts to h.
func (h Histogram) Merge(o Histogram) {
	for b, n := range o {
		h[b] += n
	}
}

// Count is how many durations h holds.
func (h Histogram) Count() uint64 {
	var n uint64
	for _, c := range h {
		n += uint64(c)
	}
	return n
}

// Quantile returns the q-quantile (0 < q ≤ 1) of h, 0 when empty.
func (h Histogram) Quantile(q float64) time.Duration {
	total := h.Count()
	if total == 0 {
		return 0
	}
	bins := make([]int, 0, len(h))
	for b := range h {
		bins = append(bins, b)
	}
	slices.Sort(bins)
	rank := uint64(math.Ceil(q * float64(total)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for _, b := range bins {
		seen += uint64(h[b])
		if seen >= rank {
			return binValue(b)
		}
	}
	return binValue(bins[len(bins)-1])
}

// TrendBucket is one time bucket of a series: the runs that ended in it
// (by the time EVENTS stored their succeeded or dead event).
type TrendBucket struct {
	Start time.Time `json:"start"`
	// Resolution is m (a minute) or h (an hour).
	Resolution string `json:"resolution"`
	Runs       int    `json:"runs"`
	Succeeded  int    `json:"succeeded"`
	Dead       int    `json:"dead"`
	// Failures counts dead runs by reason.
	Failures map[string]int `json:"failures,omitempty"`
	// AttemptFailures counts failed attempts that were retried.
	AttemptFailures int `json:"attempt_failures,omitempty"`
	// Durations of the runs' last attempts; Delays from the nominal time
	// to the handler's start (scheduled runs).
	Durations Histogram `json:"durations,omitempty"`
	Delays    Histogram `json:"delays,omitempty"`
	// LastEventSequence is the newest event counted: a leader that reads an
	// event again (failover, a retry) does not count it twice.
	LastEventSequence uint64 `json:"last_event_sequence"`
}

// P50, P95 and DelayP95 of the bucket.
func (b *TrendBucket) P50() time.Duration      { return b.Durations.Quantile(0.50) }
func (b *TrendBucket) P95() time.Duration      { return b.Durations.Quantile(0.95) }
func (b *TrendBucket) DelayP95() time.Duration { return b.Delays.Quantile(0.95) }

// FailureRate is dead runs over runs.
func (b *TrendBucket) FailureRate() float64 {
	if b.Runs == 0 {
		return 0
	}
	return float64(b.Dead) / float64(b.Runs)
}

// TrendWindow sums the buckets of a time window.
type TrendWindow struct {
	From        time.Time     `json:"from"`
	To          time.Time     `json:"to"`
	Runs        int           `json:"runs"`
	Dead        int           `json:"dead"`
	FailureRate float64       `json:"failure_rate"`
	P50         time.Duration `json:"p50"`
	P95         time.Duration `json:"p95"`
	DelayP95    time.Duration `json:"delay_p95"`
}

// SumBuckets sums buckets into a window from..to.
func SumBuckets(from, to time.Time, buckets []TrendBucket) TrendWindow {
	w := TrendWindow{From: from, To: to}
	durs, delays := Histogram{}, Histogram{}
	for i := range buckets {
		b := &buckets[i]
		w.Runs += b.Runs
		w.Dead += b.Dead
		durs.Merge(b.Durations)
		delays.Merge(b.Delays)
	}
	if w.Runs > 0 {
		w.FailureRate = float64(w.Dead) / float64(w.Runs)
	}
	w.P50, w.P95, w.DelayP95 = durs.Quantile(0.5), durs.Quantile(0.95), delays.Quantile(0.95)
	return w
}

// TrendStatus is a series' latest verdict.
type TrendStatus struct {
	// Series is kind.<queue>.<kind> or schedule.<id>.
	Series     string `json:"series"`
	Queue      string `json:"queue,omitempty"`
	Kind       string `json:"kind,omitempty"`
	ScheduleID string `json:"schedule_id,omitempty"`
	Degrading  bool   `json:"degrading"`
	// Since is when the series turned degrading.
	Since time.Time `json:"since,omitzero"`
	// Reasons say which measure departed from the baseline, in words.
	Reasons     []string    `json:"reasons,omitempty"`
	Recent      TrendWindow `json:"recent"`
	Baseline    TrendWindow `json:"baseline"`
	EvaluatedAt time.Time   `json:"evaluated_at"`
}

// TrendEvent is published on events.trend.<series>.<degrading|recovered>
// when a series' verdict changes.
type TrendEvent struct {
	Type string `json:"type"`
	TrendStatus
}

// ParseTrendSeries splits a series name into its queue and kind, or schedule id.
func ParseTrendSeries(series string) (queue, kind, scheduleID string, ok bool) {
	parts := strings.Split(series, ".")
	switch {
	case len(parts) == 3 && parts[0] == "kind":
		return parts[1], parts[2], "", true
	case len(parts) == 2 && parts[0] == "schedule":
		return "", "", parts[1], true
	}
	return "", "", "", false
}

// TrendsRequest asks for the buckets of a kind (Queue and Kind) or a
// schedule (ScheduleID) between Since and Until at a resolution (m, the
// default, or h).
type TrendsRequest struct {
	Queue      string    `json:"queue,omitempty"`
	Kind       string    `json:"kind,omitempty"`
	ScheduleID string    `json:"schedule_id,omitempty"`
	Resolution string    `json:"resolution,omitempty"`
	Since      time.Time `json:"since,omitzero"`
	Until      time.Time `json:"until,omitzero"`
}

// Series names the series of r, or returns an error naming the field.
func (r TrendsRequest) Series() (string, error) {
	switch {
	case r.ScheduleID != "" && r.Kind == "" && r.Queue == "":
		if err := protocol.ValidateToken("schedule id", r.ScheduleID); err != nil {
			return "", protocol.FieldError("schedule_id", "%v", err)
		}
	case r.ScheduleID == "" && r.Kind != "" && r.Queue != "":
		if err := protocol.ValidateToken("queue", r.Queue); err != nil {
			return "", protocol.FieldError("queue", "%v", err)
		}
		if err := protocol.ValidateToken("kind", r.Kind); err != nil {
			return "", protocol.FieldError("kind", "%v", err)
		}
	default:
		return "", protocol.FieldError("kind", "give a queue and a kind, or a schedule_id")
	}
	switch r.Resolution {
	case "", protocol.TrendMinute, protocol.TrendHour:
	default:
		return "", protocol.FieldError("resolution", "must be m or h, got %q", r.Resolution)
	}
	return protocol.TrendSeries(r.Queue, r.Kind, r.ScheduleID), nil
}

// TrendsResponse holds a series' buckets, oldest first, and its verdict.
type TrendsResponse struct {
	Series     string        `json:"series"`
	Resolution string        `json:"resolution"`
	Buckets    []TrendBucket `json:"buckets"`
	Status     *TrendStatus  `json:"status,omitempty"`
}

// TrendListResponse lists every series' verdict, degrading ones first.
type TrendListResponse struct {
	Series []TrendStatus `json:"series"`
}

// Trends returns a series' buckets and verdict.
func (c *Client) Trends(ctx context.Context, req TrendsRequest) (*TrendsResponse, error) {
	var res TrendsResponse
	return &res, c.supervisor(ctx, protocol.APITrends, &req, &res)
}

// TrendList returns every series' latest verdict.
func (c *Client) TrendList(ctx context.Context) (*TrendListResponse, error) {
	var res TrendListResponse
	return &res, c.supervisor(ctx, protocol.APITrendList, struct{}{}, &res)
}
