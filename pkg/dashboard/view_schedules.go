package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

type scheduleRow struct {
	ID       string
	Def      *jetfleet.Schedule
	Words    string
	NextFire *time.Time
	LastFire *time.Time
	Running  string
	// Last is the last finished run (nil when none is kept).
	Last *jetfleetpb.Execution
	// Runs and SuccessRate over the trend windows (24h by default).
	Runs        int
	SuccessRate float64
	Degrading   bool
}

type scheduleListBody struct {
	Filter filter
	Rows   []scheduleRow
	Total  int
	// Next is the after of the next page; Prev of the previous ("" for the first).
	Next, Prev string
	HasPrev    bool
	Queues     []string
}

func (d *Dashboard) scheduleList(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query(), d.now(), 1000, "q", "queue", "kind", "paused", "after", "limit")
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	b, err := d.scheduleListData(ctx, f)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "schedules", page{Title: "Schedules", Nav: "schedules", Live: "schedules", Query: f.values(), Body: b})
}

func (d *Dashboard) scheduleListData(ctx context.Context, f filter) (*scheduleListBody, error) {
	limit := f.Limit
	if limit == 0 {
		limit = d.cfg.PageSize
	}
	ids := d.hub.scheduleIDs()
	q := strings.ToLower(f.Q)
	// The definitions, read once under the hub's lock (filters only).
	var defs map[string]*jetfleet.Schedule
	if f.Queue != "" || f.Kind != "" || f.Paused != "" {
		d.hub.mu.Lock()
		defs = make(map[string]*jetfleet.Schedule, len(d.hub.schedules))
		for id, s := range d.hub.schedules {
			defs[id] = s
		}
		d.hub.mu.Unlock()
	}
	match := func(id string) bool {
		if q != "" && !strings.Contains(strings.ToLower(id), q) {
			return false
		}
		if defs == nil {
			return true
		}
		s := defs[id]
		return s != nil && (f.Queue == "" || s.Target.Queue == f.Queue) && (f.Kind == "" || s.Target.Kind == f.Kind) &&
			(f.Paused == "" || s.Paused == (f.Paused == "yes"))
	}
	b := &scheduleListBody{Filter: f}
	queues := map[string]bool{}
	start := sort.SearchStrings(ids, f.After)
	if f.After != "" && start < len(ids) && ids[start] == f.After {
		start++
	}
	var page []string
	var pageIdx []int
	for i, id := range ids {
		if !match(id) {
			continue
		}
		b.Total++
		if i >= start && len(page) < limit {
			page = append(page, id)
			pageIdx = append(pageIdx, i)
		} else if i >= start && len(page) == limit && b.Next == "" {
			b.Next = page[len(page)-1]
		}
	}
	d.hub.mu.Lock()
	for _, s := range d.hub.schedules {
		queues[s.Target.Queue] = true
	}
	d.hub.mu.Unlock()
	for q := range queues {
		b.Queues = append(b.Queues, q)
	}
	sort.Strings(b.Queues)
	b.HasPrev = f.After != ""
	if b.HasPrev { // the previous page ends before this one's first row
		n, j := 0, start-1
		for ; j >= 0 && n < limit; j-- {
			if match(ids[j]) {
				n++
			}
		}
		if j >= 0 {
			b.Prev = ids[j]
		}
	}
	if len(page) == 0 {
		return b, nil
	}
	var (
		wg        sync.WaitGroup
		summaries map[string]jetfleet.ScheduleSummary
		err       error
		last      map[string]*jetfleetpb.Execution
		trends    map[string]*jetfleet.TrendStatus
	)
	wg.Go(func() { summaries, err = d.summaries(ctx, ids, pageIdx) })
	wg.Go(func() { last = d.lastExecutions(ctx, page) })
	wg.Go(func() { trends = d.trendStatuses(ctx, page) })
	wg.Wait()
	if err != nil {
		return nil, err
	}
	for _, id := range page {
		def, _ := d.hub.schedule(id)
		row := scheduleRow{ID: id, Def: def, Last: last[id]}
		if def != nil {
			row.Words = specWords(&def.Spec)
		}
		if s, ok := summaries[id]; ok {
			row.NextFire, row.LastFire, row.Running = s.NextFire, s.LastFire, s.Running
		}
		if st := trends[id]; st != nil {
			row.Runs = st.Recent.Runs + st.Baseline.Runs
			if row.Runs > 0 {
				row.SuccessRate = 1 - float64(st.Recent.Dead+st.Baseline.Dead)/float64(row.Runs)
			}
			row.Degrading = st.Degrading
		}
		b.Rows = append(b.Rows, row)
	}
	return b, nil
}

// summaries asks the scheduler for the page's rows (next and last fire)
// with one listing call spanning them in id order.
func (d *Dashboard) summaries(ctx context.Context, ids []string, idx []int) (map[string]jetfleet.ScheduleSummary, error) {
	out := map[string]jetfleet.ScheduleSummary{}
	after := ""
	if idx[0] > 0 {
		after = ids[idx[0]-1]
	}
	span := idx[len(idx)-1] - idx[0] + 1
	for span > 0 {
		res, err := d.client.ListSchedules(ctx, jetfleet.ScheduleListRequest{After: after, Limit: min(span, 1000)})
		if err != nil {
			return nil, err
		}
		for _, s := range res.Schedules {
			out[s.ID] = s
		}
		span -= len(res.Schedules)
		if res.Next == "" || len(res.Schedules) == 0 {
			break
		}
		after = res.Next
	}
	return out, nil
}

// lastExecutions reads the newest history record of each schedule in one
// batched read of stream SUPERVISOR.
func (d *Dashboard) lastExecutions(ctx context.Context, ids []string) map[string]*jetfleetpb.Execution {
	subjects := make([]string, len(ids))
	for i, id := range ids {
		subjects[i] = protocol.HistoryScheduleSubject(id)
	}
	out := map[string]*jetfleetpb.Execution{}
	msgs, err := protocol.DirectGetBatch(ctx, d.nc, protocol.StreamSupervisor, protocol.DirectGetRequest{MultiLast: subjects, Batch: len(ids)})
	if err != nil {
		return out
	}
	for _, m := range msgs {
		var e jetfleetpb.Execution
		if protocol.Unmarshal(m.Data, &e) == nil {
			out[e.GetScheduleId()] = &e
		}
	}
	return out
}

// trendStatuses reads the verdicts of schedules in one batched read of TRENDS.
func (d *Dashboard) trendStatuses(ctx context.Context, ids []string) map[string]*jetfleet.TrendStatus {
	subjects := make([]string, len(ids))
	for i, id := range ids {
		subjects[i] = protocol.TrendStatusSubject(protocol.TrendSeries("", "", id))
	}
	out := map[string]*jetfleet.TrendStatus{}
	msgs, err := protocol.DirectGetBatch(ctx, d.nc, protocol.StreamTrends, protocol.DirectGetRequest{MultiLast: subjects, Batch: len(ids)})
	if err != nil {
		return out
	}
	for _, m := range msgs {
		var st jetfleet.TrendStatus
		if json.Unmarshal(m.Data, &st) == nil {
			out[st.ScheduleID] = &st
		}
	}
	return out
}

// runRow is one line of a schedule's or kind's runs: an execution, a fire
// not finished yet, a skipped or missed fire, or an operator action.
type runRow struct {
	Time        time.Time
	Kind        string // run, fired, skipped, missed, paused, resumed, created, updated, action
	JobID       string
	NominalTime time.Time
	Status      string
	Attempts    uint32
	Duration    time.Duration
	AgentID     string
	Error       string
	Reason      string
	TraceID     string
	Count       uint32
	Actor       string
	Outcome     string
}

type scheduleBody struct {
	Info      *jetfleet.ScheduleInfo
	Words     string
	Next      []time.Time
	Zone      string
	Stats     jetfleet.HistoryStats
	Runs      []runRow
	Trend     *jetfleet.TrendsResponse
	Res       string
	Charts    charts
	JaegerUI  string
	BackFrom  string
	BackTo    string
	Skipped   int
	Missed    int
	Degrading *jetfleet.TrendStatus
}

func (d *Dashboard) scheduleDetail(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := protocol.ValidateToken("schedule id", id); err != nil {
		d.fail(w, r, http.StatusNotFound, "No schedule "+id+": "+err.Error())
		return
	}
	q := r.URL.Query()
	res := q.Get("res")
	if res != "" && res != protocol.TrendMinute && res != protocol.TrendHour {
		d.fail(w, r, http.StatusBadRequest, "Malformed filter: res: must be m (minutes) or h (hours)")
		return
	}
	q.Del("res")
	if _, err := parseFilter(q, d.now(), 0); err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	info, err := d.client.GetSchedule(ctx, id)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	now := d.now()
	b := &scheduleBody{Info: info, Words: specWords(&info.Schedule.Spec), Res: res, JaegerUI: d.cfg.Jaeger.UIURL,
		BackFrom: now.Add(-time.Hour).UTC().Format("2006-01-02T15:04"), BackTo: now.UTC().Format("2006-01-02T15:04")}
	if pv, err := d.client.PreviewSchedule(ctx, jetfleet.PreviewRequest{ID: id, Count: 10}); err == nil {
		b.Next, b.Zone = pv.Times, pv.Zone
	}
	hist, err := d.client.History(ctx, jetfleet.HistoryRequest{ScheduleID: id, Limit: d.cfg.Executions})
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	b.Stats = hist.Stats
	execs, _ := hist.Decode()
	timeline, err := d.client.ScheduleTimeline(ctx, id, 2*d.cfg.Executions)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	b.Runs, b.Skipped, b.Missed = mergeRuns(execs, timeline, 2*d.cfg.Executions)
	b.Trend, b.Charts = d.trendCharts(ctx, jetfleet.TrendsRequest{ScheduleID: id}, res, now)
	if b.Trend != nil && b.Trend.Status != nil && b.Trend.Status.Degrading {
		b.Degrading = b.Trend.Status
	}
	d.render(w, r, http.StatusOK, "schedule", page{Title: "Schedule " + id, Nav: "schedules", Live: "schedule:" + id, Body: b})
}

// mergeRuns puts executions, fires, skipped and missed fires and actions
// in one timeline, newest first.
func mergeRuns(execs []*jetfleetpb.Execution, timeline []jetfleet.TimelineEntry, limit int) (rows []runRow, skipped, missed int) {
	finished := map[string]bool{}
	for _, e := range execs {
		finished[e.GetJobId()] = true
		rows = append(rows, runRow{Time: e.GetFinishedAt().AsTime(), Kind: "run", JobID: e.GetJobId(), NominalTime: asTime(e.GetNominalTime()),
			Status: e.GetStatus(), Attempts: e.GetAttempts(), Duration: e.GetDuration().AsDuration(), AgentID: e.GetAgentId(),
			Error: firstLine(e.GetError()), Reason: e.GetReason(), TraceID: e.GetTraceId()})
	}
	oldestExec := time.Time{}
	if len(execs) > 0 {
		oldestExec = execs[len(execs)-1].GetFinishedAt().AsTime()
	}
	for _, t := range timeline {
		switch {
		case t.Audit != nil:
			rows = append(rows, runRow{Time: t.Audit.Time, Kind: "action", Status: t.Audit.Action, Actor: t.Audit.Actor,
				Outcome: t.Audit.Outcome, Error: t.Audit.Error, Reason: t.Audit.Detail})
		case t.Schedule != nil:
			ev := t.Schedule
			row := runRow{Time: asTime(ev.GetTime()), Kind: ev.GetType(), JobID: ev.GetJobId(), NominalTime: asTime(ev.GetNominalTime()),
				Reason: ev.GetReason(), Count: ev.GetCount(), TraceID: ev.GetTraceId()}
			switch ev.GetType() {
			case protocol.EventFired:
				// A fire shows until its run finishes; older fires than the
				// oldest execution kept are not shown at all.
				if finished[ev.GetJobId()] || (!oldestExec.IsZero() && row.Time.Before(oldestExec)) {
					continue
				}
				row.Status = "running"
			case protocol.EventSkipped:
				skipped++
			case protocol.EventMissed:
				missed++
			}
			rows = append(rows, row)
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Time.After(rows[j].Time) })
	if len(rows) > limit {
		rows = rows[:limit]
	}
	return rows, skipped, missed
}

func asTime(ts interface{ AsTime() time.Time }) time.Time {
	if ts == nil {
		return time.Time{}
	}
	if v, ok := ts.(interface{ IsValid() bool }); ok && !v.IsValid() {
		return time.Time{}
	}
	return ts.AsTime()
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// kinds of the fleet: queue and kind pairs that ran (trends) or that an
// agent serves.
type kindRow struct {
	Queue, Kind string
	Agents      int
	Status      *jetfleet.TrendStatus
}

type kindListBody struct {
	Filter filter
	Rows   []kindRow
}

func (d *Dashboard) kindList(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query(), d.now(), 0, "queue", "kind")
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	rows := map[string]*kindRow{}
	get := func(q, k string) *kindRow {
		key := q + "." + k
		if rows[key] == nil {
			rows[key] = &kindRow{Queue: q, Kind: k}
		}
		return rows[key]
	}
	tl, err := d.client.TrendList(ctx)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	for i := range tl.Series {
		s := &tl.Series[i]
		if s.Kind != "" {
			get(s.Queue, s.Kind).Status = s
		}
	}
	agents, err := d.client.Agents(ctx)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	for _, a := range agents.Agents {
		if a.State == jetfleet.AgentDead {
			continue
		}
		for _, q := range a.Queues {
			for _, k := range a.Kinds {
				get(q, k).Agents++
			}
		}
	}
	b := &kindListBody{Filter: f}
	for _, row := range rows {
		if (f.Queue == "" || row.Queue == f.Queue) && (f.Kind == "" || row.Kind == f.Kind) {
			b.Rows = append(b.Rows, *row)
		}
	}
	slices.SortFunc(b.Rows, func(a, c kindRow) int {
		ad, cd := a.Status != nil && a.Status.Degrading, c.Status != nil && c.Status.Degrading
		if ad != cd {
			if ad {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Queue+"."+a.Kind, c.Queue+"."+c.Kind)
	})
	d.render(w, r, http.StatusOK, "kinds", page{Title: "Job kinds", Nav: "kinds", Live: "kinds", Query: f.values(), Body: b})
}

type kindBody struct {
	Queue, Kind string
	Stats       jetfleet.HistoryStats
	Runs        []runRow
	Trend       *jetfleet.TrendsResponse
	Res         string
	Charts      charts
	JaegerUI    string
	Degrading   *jetfleet.TrendStatus
}

func (d *Dashboard) kindDetail(w http.ResponseWriter, r *http.Request) {
	queue, kind := r.PathValue("queue"), r.PathValue("kind")
	for what, v := range map[string]string{"queue": queue, "kind": kind} {
		if err := protocol.ValidateToken(what, v); err != nil {
			d.fail(w, r, http.StatusNotFound, "No such kind: "+err.Error())
			return
		}
	}
	q := r.URL.Query()
	res := q.Get("res")
	if res != "" && res != protocol.TrendMinute && res != protocol.TrendHour {
		d.fail(w, r, http.StatusBadRequest, "Malformed filter: res: must be m (minutes) or h (hours)")
		return
	}
	q.Del("res")
	if _, err := parseFilter(q, d.now(), 0); err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	hist, err := d.client.History(ctx, jetfleet.HistoryRequest{Queue: queue, Kind: kind, Limit: d.cfg.Executions})
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	execs, _ := hist.Decode()
	b := &kindBody{Queue: queue, Kind: kind, Stats: hist.Stats, Res: res, JaegerUI: d.cfg.Jaeger.UIURL}
	b.Runs, _, _ = mergeRuns(execs, nil, d.cfg.Executions)
	b.Trend, b.Charts = d.trendCharts(ctx, jetfleet.TrendsRequest{Queue: queue, Kind: kind}, res, d.now())
	if len(execs) == 0 && (b.Trend == nil || len(b.Trend.Buckets) == 0) && !d.served(ctx, queue, kind) {
		d.fail(w, r, http.StatusNotFound, "No run of kind "+kind+" on queue "+queue+" is recorded, and no agent runs it.")
		return
	}
	if b.Trend != nil && b.Trend.Status != nil && b.Trend.Status.Degrading {
		b.Degrading = b.Trend.Status
	}
	d.render(w, r, http.StatusOK, "kind", page{Title: "Kind " + kind + " on " + queue, Nav: "kinds", Live: "kind:" + queue + "." + kind, Body: b})
}

// served reports whether a live agent runs kind on queue.
func (d *Dashboard) served(ctx context.Context, queue, kind string) bool {
	agents, err := d.client.Agents(ctx)
	if err != nil {
		return false
	}
	for _, a := range agents.Agents {
		if a.State != jetfleet.AgentDead && slices.Contains(a.Queues, queue) && slices.Contains(a.Kinds, kind) {
			return true
		}
	}
	return false
}
