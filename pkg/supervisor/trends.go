package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jetfleet/jetfleet/pkg/config"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// Trends (docs/supervision.md §12): the leader rolls finished runs up into
// minute and hour buckets per job kind and per schedule — runs, successes,
// dead runs by reason, retried attempts, durations and scheduling delays as
// histograms — stored in stream TRENDS, one message per bucket. It reads
// the job events with an ordered consumer from its cursor (stored in
// TRENDS after the buckets), so a new leader continues where the last one
// stopped; each bucket records the newest event it counted, so an event
// read again is not counted twice; with no cursor at all (a new stream) it
// rebuilds from every event EVENTS still holds. After each batch it
// compares each touched series' recent window with its own baseline and
// marks it degrading — a TrendEvent, an alert and a status message — when
// its p95 duration or its failure rate departs beyond the configured
// factors.

// TrendsConfig configures the rollups and the degrading verdict
// (supervisor.trends).
type TrendsConfig struct {
	// Disabled turns trends off.
	Disabled bool `koanf:"disabled"`
	// MinuteRetention keeps minute buckets. Defaults to 48h.
	MinuteRetention time.Duration `koanf:"minute_retention"`
	// HourRetention keeps hour buckets. Defaults to 720h (30 days).
	HourRetention time.Duration `koanf:"hour_retention"`
	// RecentWindow is the window judged. Defaults to 15m.
	RecentWindow time.Duration `koanf:"recent_window"`
	// BaselineWindow is what the recent window is compared with: the
	// window before it. Defaults to 24h.
	BaselineWindow time.Duration `koanf:"baseline_window"`
	// DurationFactor marks a series degrading when its recent p95 duration
	// exceeds the baseline's p95 times this. Defaults to 2.
	DurationFactor float64 `koanf:"duration_factor"`
	// FailureFactor marks a series degrading when its recent failure rate
	// (failed attempts over attempts) exceeds the baseline's times this and
	// by at least MinFailureIncrease. Defaults to 2 and 0.1.
	FailureFactor      float64 `koanf:"failure_factor"`
	MinFailureIncrease float64 `koanf:"min_failure_increase"`
	// MinRecentRuns and MinBaselineRuns: fewer runs judge nothing.
	// Default to 5 and 20.
	MinRecentRuns   int `koanf:"min_recent_runs"`
	MinBaselineRuns int `koanf:"min_baseline_runs"`
	// EvaluateInterval bounds how often one series is judged. Defaults to 10s.
	EvaluateInterval time.Duration `koanf:"evaluate_interval"`
	// Severity of the degrading alert: info, warning, critical or none.
	// Defaults to warning.
	Alert string `koanf:"alert"`
}

func (c TrendsConfig) withDefaults() TrendsConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.MinuteRetention, 48*time.Hour)
	def(&c.HourRetention, 720*time.Hour)
	def(&c.RecentWindow, 15*time.Minute)
	def(&c.BaselineWindow, 24*time.Hour)
	def(&c.EvaluateInterval, 10*time.Second)
	for _, f := range []struct {
		p *float64
		v float64
	}{{&c.DurationFactor, 2}, {&c.FailureFactor, 2}, {&c.MinFailureIncrease, 0.1}} {
		if *f.p == 0 {
			*f.p = f.v
		}
	}
	if c.MinRecentRuns == 0 {
		c.MinRecentRuns = 5
	}
	if c.MinBaselineRuns == 0 {
		c.MinBaselineRuns = 20
	}
	if c.Alert == "" {
		c.Alert = protocol.SeverityWarning
	}
	return c
}

func (c TrendsConfig) validate(section string) error {
	var errs []error
	for k, d := range map[string]time.Duration{"minute_retention": c.MinuteRetention, "hour_retention": c.HourRetention,
		"recent_window": c.RecentWindow, "baseline_window": c.BaselineWindow, "evaluate_interval": c.EvaluateInterval} {
		if d < 0 {
			errs = append(errs, config.Invalid(section+"."+k, "must not be negative, got %s", d))
		}
	}
	if c.MinuteRetention != 0 && c.MinuteRetention < time.Hour {
		errs = append(errs, config.Invalid(section+".minute_retention", "must be at least 1h, got %s", c.MinuteRetention))
	}
	if c.HourRetention != 0 && c.HourRetention < 24*time.Hour {
		errs = append(errs, config.Invalid(section+".hour_retention", "must be at least 24h, got %s", c.HourRetention))
	}
	if c.DurationFactor < 0 || (c.DurationFactor > 0 && c.DurationFactor <= 1) || c.FailureFactor < 0 || (c.FailureFactor > 0 && c.FailureFactor <= 1) {
		errs = append(errs, config.Invalid(section+".duration_factor", "factors must be above 1"))
	}
	if c.MinFailureIncrease < 0 || c.MinFailureIncrease > 1 || c.MinRecentRuns < 0 || c.MinBaselineRuns < 0 {
		errs = append(errs, config.Invalid(section+".min_failure_increase", "must be 0 to 1; run counts must not be negative"))
	}
	if err := validSeverity(c.Alert, true); err != nil {
		errs = append(errs, config.Invalid(section+".alert", "%v", err))
	}
	return errors.Join(errs...)
}

// trendCursorSubject keeps the last EVENTS sequence whose buckets are stored.
const trendCursorSubject = "jetfleet.trends.cursor"

// trendBatch is how many events one pass reads.
const trendBatch = 500

type trends struct {
	s   *Supervisor
	cfg TrendsConfig

	mu sync.Mutex
	// buckets caches buckets by subject (the leader's own writes).
	buckets map[string]*jetfleet.TrendBucket
	// judged is when each series was last judged; status its verdict.
	judged map[string]time.Time
	status map[string]*jetfleet.TrendStatus
}

func newTrends(s *Supervisor) *trends {
	return &trends{s: s, cfg: s.cfg.Trends.withDefaults(), buckets: map[string]*jetfleet.TrendBucket{},
		judged: map[string]time.Time{}, status: map[string]*jetfleet.TrendStatus{}}
}

func (t *trends) reset() {
	t.mu.Lock()
	t.buckets = map[string]*jetfleet.TrendBucket{}
	t.judged = map[string]time.Time{}
	t.status = map[string]*jetfleet.TrendStatus{}
	t.mu.Unlock()
}

// provision creates stream TRENDS (one message per subject, per-message TTLs).
func (t *trends) provision(ctx context.Context) error {
	topo := t.s.topo.WithDefaults()
	storage := jetstream.FileStorage
	if topo.Storage == "memory" {
		storage = jetstream.MemoryStorage
	}
	return topology.EnsureStream(ctx, t.s.js, jetstream.StreamConfig{
		Name:              protocol.StreamTrends,
		Description:       "jetfleet supervisor: trend buckets per job kind and schedule, their verdicts",
		Subjects:          []string{protocol.TrendsSubjects},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxMsgsPerSubject: 1,
		Storage:           storage,
		Replicas:          topo.Replicas,
		AllowDirect:       true,
		AllowMsgTTL:       true,
	}, topo.AllowDestructiveUpdates)
}

// lead is the leader task: provision, then read events from the cursor.
func (t *trends) lead(ctx context.Context) {
	if t.cfg.Disabled {
		return
	}
	for ctx.Err() == nil {
		err := t.run(ctx)
		if ctx.Err() != nil {
			return
		}
		t.s.log.Warn("trends: reading events failed; starting again from the stored cursor", telemetry.LogError, err)
		t.reset()
		sleepCtx(ctx, time.Second)
	}
}

func (t *trends) run(ctx context.Context) error {
	rctx, cancel := t.s.requestCtx(ctx)
	defer cancel()
	if err := t.provision(rctx); err != nil {
		return err
	}
	cursor, err := t.cursor(rctx)
	if err != nil {
		return err
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{
		protocol.JobEventsOfType("*", "*", protocol.EventSucceeded), protocol.JobEventsOfType("*", "*", protocol.EventDead),
		protocol.JobEventsOfType("*", "*", protocol.EventRetrying), protocol.JobEventsOfType("*", "*", protocol.EventTimedOut)}}
	if cursor > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, cursor+1
	}
	cons, err := t.s.js.OrderedConsumer(rctx, protocol.StreamEvents, cfg)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		b, err := cons.Fetch(trendBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		var msgs []jetstream.Msg
		for m := range b.Messages() {
			msgs = append(msgs, m)
		}
		if len(msgs) == 0 {
			continue
		}
		if err := t.apply(ctx, msgs); err != nil {
			return err
		}
	}
	return nil
}

func (t *trends) cursor(ctx context.Context) (uint64, error) {
	m, err := protocol.DirectGetLast(ctx, t.s.nc, protocol.StreamTrends, trendCursorSubject)
	if err != nil || m == nil {
		return 0, err
	}
	var c struct {
		Sequence uint64 `json:"sequence"`
	}
	return c.Sequence, json.Unmarshal(m.Data, &c)
}

// apply counts msgs (in stream order) into their buckets, stores the
// buckets and then the cursor, and judges the series touched.
func (t *trends) apply(ctx context.Context, msgs []jetstream.Msg) error {
	touched := map[string]*jetfleet.TrendBucket{}
	series := map[string]bool{}
	var last uint64
	for _, m := range msgs {
		meta, err := m.Metadata()
		if err != nil {
			continue
		}
		last = meta.Sequence.Stream
		var ev jetfleetpb.JobEvent
		if protocol.Unmarshal(m.Data(), &ev) != nil || ev.GetQueue() == "" || ev.GetKind() == "" {
			continue
		}
		at := meta.Timestamp
		if ev.GetTime() != nil {
			at = ev.GetTime().AsTime()
		}
		names := []string{protocol.TrendSeries(ev.GetQueue(), ev.GetKind(), "")}
		if id := ev.GetScheduleId(); id != "" && protocol.ValidateToken("schedule id", id) == nil {
			names = append(names, protocol.TrendSeries("", "", id))
		}
		for _, name := range names {
			series[name] = true
			for _, res := range []string{protocol.TrendMinute, protocol.TrendHour} {
				start := bucketStart(res, at)
				subject := protocol.TrendBucketSubject(res, name, start)
				b := touched[subject]
				if b == nil {
					if b, err = t.bucket(ctx, subject, res, start); err != nil {
						return err
					}
					touched[subject] = b
				}
				count(b, &ev, last)
			}
		}
	}
	// Store the buckets, then the cursor.
	var futures []jetstream.PubAckFuture
	for subject, b := range touched {
		ttl := t.cfg.MinuteRetention
		if b.Resolution == protocol.TrendHour {
			ttl = t.cfg.HourRetention
		}
		data, err := json.Marshal(b)
		if err != nil {
			return err
		}
		f, err := t.s.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: data}, jetstream.WithMsgTTL(ttl))
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	if err := waitFutures(ctx, futures, t.s.cfg.RequestTimeout); err != nil {
		return err
	}
	rctx, cancel := t.s.requestCtx(ctx)
	defer cancel()
	data, _ := json.Marshal(map[string]uint64{"sequence": last})
	if _, err := t.s.js.Publish(rctx, trendCursorSubject, data); err != nil {
		return err
	}
	t.mu.Lock()
	for subject, b := range touched {
		t.buckets[subject] = b
	}
	t.evictLocked(t.s.clk.Now())
	t.mu.Unlock()
	for name := range series {
		t.judge(ctx, name, false)
	}
	return nil
}

func waitFutures(ctx context.Context, futures []jetstream.PubAckFuture, timeout time.Duration) error {
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-tctx.Done():
			return tctx.Err()
		}
	}
	return nil
}

// count adds one event at EVENTS sequence seq to b, unless b counted it.
func count(b *jetfleet.TrendBucket, ev *jetfleetpb.JobEvent, seq uint64) {
	if seq <= b.LastEventSequence {
		return
	}
	b.LastEventSequence = seq
	switch ev.GetType() {
	case protocol.EventRetrying, protocol.EventTimedOut:
		b.AttemptFailures++
		return
	case protocol.EventSucceeded:
		b.Succeeded++
	case protocol.EventDead:
		b.Dead++
		if b.Failures == nil {
			b.Failures = map[string]int{}
		}
		b.Failures[ev.GetReason()]++
	default:
		return
	}
	b.Runs++
	if ev.GetDuration() != nil && ev.GetDuration().AsDuration() > 0 {
		if b.Durations == nil {
			b.Durations = jetfleet.Histogram{}
		}
		b.Durations.Add(ev.GetDuration().AsDuration())
	}
	if ev.GetNominalTime() != nil && ev.GetStartedAt() != nil {
		if d := ev.GetStartedAt().AsTime().Sub(ev.GetNominalTime().AsTime()); d >= 0 {
			if b.Delays == nil {
				b.Delays = jetfleet.Histogram{}
			}
			b.Delays.Add(d)
		}
	}
}

func bucketStart(res string, at time.Time) time.Time {
	if res == protocol.TrendHour {
		return at.UTC().Truncate(time.Hour)
	}
	return at.UTC().Truncate(time.Minute)
}

// bucket returns the bucket on subject: cached, stored, or new.
func (t *trends) bucket(ctx context.Context, subject, res string, start time.Time) (*jetfleet.TrendBucket, error) {
	t.mu.Lock()
	b, ok := t.buckets[subject]
	t.mu.Unlock()
	if ok {
		c := *b
		c.Failures = cloneMap(b.Failures)
		c.Durations, c.Delays = cloneHist(b.Durations), cloneHist(b.Delays)
		return &c, nil
	}
	rctx, cancel := t.s.requestCtx(ctx)
	defer cancel()
	m, err := protocol.DirectGetLast(rctx, t.s.nc, protocol.StreamTrends, subject)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return &jetfleet.TrendBucket{Start: start, Resolution: res}, nil
	}
	var stored jetfleet.TrendBucket
	if err := json.Unmarshal(m.Data, &stored); err != nil {
		return &jetfleet.TrendBucket{Start: start, Resolution: res}, nil
	}
	return &stored, nil
}

func cloneMap(m map[string]int) map[string]int {
	if m == nil {
		return nil
	}
	c := make(map[string]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func cloneHist(h jetfleet.Histogram) jetfleet.Histogram {
	if h == nil {
		return nil
	}
	c := make(jetfleet.Histogram, len(h))
	c.Merge(h)
	return c
}

// evictLocked drops cached buckets no new event is likely to touch.
func (t *trends) evictLocked(now time.Time) {
	if len(t.buckets) < 10_000 {
		return
	}
	for subject, b := range t.buckets {
		if now.Sub(b.Start) > 2*time.Hour {
			delete(t.buckets, subject)
		}
	}
}

// readBuckets reads the buckets of series at res that started at or after
// from (and before to, when set), oldest first.
func (s *Supervisor) readBuckets(ctx context.Context, series, res string, from, to time.Time) ([]jetfleet.TrendBucket, error) {
	var out []jetfleet.TrendBucket
	seq := uint64(0)
	for {
		req := protocol.DirectGetRequest{NextBySubject: protocol.TrendBucketsOf(res, series), Batch: 1000}
		if seq == 0 {
			req.StartTime = &from
		} else {
			req.Seq = seq
		}
		msgs, err := protocol.DirectGetBatch(ctx, s.nc, protocol.StreamTrends, req)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			seq = m.Sequence + 1
			var b jetfleet.TrendBucket
			if json.Unmarshal(m.Data, &b) != nil || b.Start.Before(from) || (!to.IsZero() && !b.Start.Before(to)) {
				continue
			}
			out = append(out, b)
		}
		if len(msgs) < 1000 {
			break
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out, nil
}

// window sums a series between from and to: hour buckets for whole hours,
// minute buckets for the rest.
func (s *Supervisor) window(ctx context.Context, series string, from, to time.Time) (jetfleet.TrendWindow, error) {
	hourFrom, hourTo := from.UTC().Truncate(time.Hour), to.UTC().Truncate(time.Hour)
	if hourFrom.Before(from) {
		hourFrom = hourFrom.Add(time.Hour)
	}
	var buckets []jetfleet.TrendBucket
	if hourTo.After(hourFrom) {
		hours, err := s.readBuckets(ctx, series, protocol.TrendHour, hourFrom, hourTo)
		if err != nil {
			return jetfleet.TrendWindow{}, err
		}
		buckets = append(buckets, hours...)
		minutes, err := s.readBuckets(ctx, series, protocol.TrendMinute, from, hourFrom)
		if err != nil {
			return jetfleet.TrendWindow{}, err
		}
		buckets = append(buckets, minutes...)
		from = hourTo
	}
	minutes, err := s.readBuckets(ctx, series, protocol.TrendMinute, from, to)
	if err != nil {
		return jetfleet.TrendWindow{}, err
	}
	buckets = append(buckets, minutes...)
	w := jetfleet.SumBuckets(from, to, buckets)
	return w, nil
}

// judge compares a series' recent window with its baseline and publishes
// a change of verdict (force: judge even inside evaluate_interval).
func (t *trends) judge(ctx context.Context, series string, force bool) {
	now := t.s.clk.Now()
	t.mu.Lock()
	if last, ok := t.judged[series]; ok && !force && now.Sub(last) < t.cfg.EvaluateInterval {
		t.mu.Unlock()
		return
	}
	t.judged[series] = now
	prev := t.status[series]
	t.mu.Unlock()
	rctx, cancel := t.s.requestCtx(ctx)
	defer cancel()
	if prev == nil {
		prev, _ = t.s.trendStatus(rctx, series)
	}
	recentFrom := now.Add(-t.cfg.RecentWindow)
	recent, err := t.s.window(rctx, series, recentFrom, now.Add(time.Minute))
	if err != nil {
		return
	}
	baseline, err := t.s.window(rctx, series, recentFrom.Add(-t.cfg.BaselineWindow), recentFrom)
	if err != nil {
		return
	}
	recent.From, recent.To = recentFrom, now
	baseline.From, baseline.To = recentFrom.Add(-t.cfg.BaselineWindow), recentFrom
	queue, kind, scheduleID, _ := jetfleet.ParseTrendSeries(series)
	st := &jetfleet.TrendStatus{Series: series, Queue: queue, Kind: kind, ScheduleID: scheduleID, Recent: recent,
		Baseline: baseline, EvaluatedAt: now}
	degrading, reasons, judged := t.verdict(recent, baseline)
	if !judged && prev != nil {
		degrading, st.Reasons = prev.Degrading, prev.Reasons // too few runs: keep the verdict
	} else {
		st.Reasons = reasons
	}
	st.Degrading = degrading
	if degrading {
		st.Since = now
		if prev != nil && prev.Degrading {
			st.Since = prev.Since
		}
	}
	data, _ := json.Marshal(st)
	if _, err := t.s.js.Publish(rctx, protocol.TrendStatusSubject(series), data); err != nil {
		t.s.log.Warn("trends: cannot store a verdict", "series", series, telemetry.LogError, err)
		return
	}
	t.mu.Lock()
	t.status[series] = st
	t.mu.Unlock()
	wasDegrading := prev != nil && prev.Degrading
	if degrading == wasDegrading {
		return
	}
	typ := protocol.EventRecovered
	if degrading {
		typ = protocol.EventDegrading
	}
	evData, _ := json.Marshal(jetfleet.TrendEvent{Type: typ, TrendStatus: *st})
	if _, err := t.s.js.Publish(rctx, protocol.TrendEventSubject(series, typ), evData); err != nil {
		t.s.log.Warn("trends: cannot publish a trend event", "series", series, telemetry.LogError, err)
	}
	t.s.log.Warn("trend verdict changed", "series", series, "verdict", typ, "reasons", strings.Join(st.Reasons, "; "))
	if degrading && t.cfg.Alert != "none" {
		t.s.alerter.raise(ctx, &jetfleetpb.Alert{Key: "degrading:" + series, Type: "degrading", Severity: t.cfg.Alert,
			Queue: queue, Kind: kind, ScheduleId: scheduleID, Value: recent.P95.Seconds(), Threshold: baseline.P95.Seconds(),
			Summary: fmt.Sprintf("%s is degrading: %s", series, strings.Join(st.Reasons, "; "))})
	}
}

// verdict judges recent against baseline; judged is false with too few runs.
func (t *trends) verdict(recent, baseline jetfleet.TrendWindow) (degrading bool, reasons []string, judged bool) {
	if recent.Runs < t.cfg.MinRecentRuns || baseline.Runs < t.cfg.MinBaselineRuns {
		return false, nil, false
	}
	if baseline.P95 > 0 && float64(recent.P95) > t.cfg.DurationFactor*float64(baseline.P95) {
		reasons = append(reasons, fmt.Sprintf("p95 duration %s is %.1f× its baseline %s", recent.P95.Round(time.Millisecond),
			float64(recent.P95)/float64(baseline.P95), baseline.P95.Round(time.Millisecond)))
	}
	rf, bf := recent.FailureRate, baseline.FailureRate
	if rf >= t.cfg.FailureFactor*bf && rf-bf >= t.cfg.MinFailureIncrease {
		reasons = append(reasons, fmt.Sprintf("failure rate %.0f%% against %.0f%% in its baseline", 100*rf, 100*bf))
	}
	return len(reasons) > 0, reasons, true
}

// trendStatus reads a series' stored verdict (nil when none).
func (s *Supervisor) trendStatus(ctx context.Context, series string) (*jetfleet.TrendStatus, error) {
	m, err := protocol.DirectGetLast(ctx, s.nc, protocol.StreamTrends, protocol.TrendStatusSubject(series))
	if errors.Is(err, nats.ErrNoResponders) || m == nil { // no stream TRENDS yet, or no verdict
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st jetfleet.TrendStatus
	return &st, json.Unmarshal(m.Data, &st)
}

func (s *Supervisor) apiTrends(ctx context.Context, data []byte) (any, error) {
	var req jetfleet.TrendsRequest
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	series, err := req.Series()
	if err != nil {
		return nil, err
	}
	res := req.Resolution
	if res == "" {
		res = protocol.TrendMinute
	}
	now := s.clk.Now()
	since, until := req.Since, req.Until
	if since.IsZero() {
		since = now.Add(-6 * time.Hour)
		if res == protocol.TrendHour {
			since = now.Add(-7 * 24 * time.Hour)
		}
	}
	buckets, err := s.readBuckets(ctx, series, res, bucketStart(res, since), until)
	if err != nil && !errors.Is(err, nats.ErrNoResponders) {
		return nil, internal(err)
	}
	if buckets == nil {
		buckets = []jetfleet.TrendBucket{}
	}
	st, err := s.trendStatus(ctx, series)
	if err != nil {
		return nil, internal(err)
	}
	return &jetfleet.TrendsResponse{Series: series, Resolution: res, Buckets: buckets, Status: st}, nil
}

func (s *Supervisor) apiTrendList(ctx context.Context, data []byte) (any, error) {
	var req struct{}
	if err := protocol.DecodeRequest(data, &req); err != nil {
		return nil, err
	}
	res := &jetfleet.TrendListResponse{Series: []jetfleet.TrendStatus{}}
	msgs, err := protocol.DirectGetBatch(ctx, s.nc, protocol.StreamTrends,
		protocol.DirectGetRequest{MultiLast: []string{protocol.TrendStatusSubjects}, Batch: 10_000})
	if err != nil && !errors.Is(err, nats.ErrNoResponders) {
		return nil, internal(err)
	}
	for _, m := range msgs {
		var st jetfleet.TrendStatus
		if json.Unmarshal(m.Data, &st) == nil {
			res.Series = append(res.Series, st)
		}
	}
	slices.SortFunc(res.Series, func(a, b jetfleet.TrendStatus) int {
		if a.Degrading != b.Degrading {
			if a.Degrading {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Series, b.Series)
	})
	return res, nil
}
