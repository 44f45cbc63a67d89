package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"
	"sync"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/lease"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

type queueRow struct {
	jetfleet.QueueStatus
	Running, Delayed int
	In, Out          float64
	RatesKnown       bool
}

type count struct {
	Name string
	N    int
}

type overviewBody struct {
	Status           *jetfleet.FleetStatus
	SchedulerLeader  string
	SupervisorLeader string
	Alive, Dead      []jetfleet.AgentInfo
	Queues           []queueRow
	DLQByReason      []count
	DLQCounted       int
	Alerts           []*jetfleetpb.Alert
	Fires            []*jetfleetpb.ScheduleEvent
	Degrading        []jetfleet.TrendStatus
	Schedules        int
	Paused           int
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	if _, err := parseFilter(r.URL.Query(), d.now(), 0); err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	b, err := d.overviewData(ctx)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", Live: "overview", Body: b})
}

func (d *Dashboard) overviewData(ctx context.Context) (*overviewBody, error) {
	now := d.now()
	b := &overviewBody{}
	// The calls go out at once: the page waits for the slowest, not the sum.
	var (
		wg                         sync.WaitGroup
		st                         *jetfleet.FleetStatus
		agents                     *jetfleet.AgentsResponse
		running                    *jetfleet.RunningJobsResponse
		trends                     *jetfleet.TrendListResponse
		stErr, agErr, runErr, tErr error
	)
	wg.Go(func() { st, stErr = d.client.Status(ctx) })
	wg.Go(func() { agents, agErr = d.client.Agents(ctx) })
	wg.Go(func() { running, runErr = d.client.RunningJobs(ctx, jetfleet.RunningJobsRequest{}) })
	wg.Go(func() { trends, tErr = d.client.TrendList(ctx) })
	wg.Go(func() { b.SchedulerLeader = d.leaseHolder(ctx, "scheduler") })
	wg.Wait()
	if err := errors.Join(stErr, agErr, runErr); err != nil {
		return nil, err
	}
	b.Status = st
	b.SupervisorLeader = st.Leader
	for _, a := range agents.Agents {
		if a.State == jetfleet.AgentDead {
			b.Dead = append(b.Dead, a)
		} else {
			b.Alive = append(b.Alive, a)
		}
	}
	perQueue := map[string]int{}
	for _, j := range running.Jobs {
		perQueue[j.Queue]++
	}
	for _, q := range st.Queues {
		row := queueRow{QueueStatus: q, Running: perQueue[q.Queue]}
		row.Delayed = max(0, q.AckPending-row.Running)
		row.In, row.Out, row.RatesKnown = d.hub.rates(q.Queue, now)
		b.Queues = append(b.Queues, row)
	}
	d.hub.mu.Lock()
	for reason, n := range d.hub.dlqReason {
		b.DLQByReason = append(b.DLQByReason, count{reason, n})
		b.DLQCounted += n
	}
	d.hub.mu.Unlock()
	sort.Slice(b.DLQByReason, func(i, j int) bool { return b.DLQByReason[i].N > b.DLQByReason[j].N })
	b.Alerts = firstN(d.hub.recentAlerts(), 10)
	b.Fires = firstN(d.hub.recentFires(), 10)
	if tErr == nil {
		for _, s := range trends.Series {
			if s.Degrading {
				b.Degrading = append(b.Degrading, s)
			}
		}
	}
	d.hub.mu.Lock()
	b.Schedules = len(d.hub.schedules)
	for _, s := range d.hub.schedules {
		if s.Paused {
			b.Paused++
		}
	}
	d.hub.mu.Unlock()
	return b, nil
}

func firstN[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// leaseHolder reads who holds a role's leader lease (bucket leases).
func (d *Dashboard) leaseHolder(ctx context.Context, key string) string {
	m, err := protocol.DirectGetLast(ctx, d.nc, "KV_"+protocol.BucketLeases, "$KV."+protocol.BucketLeases+"."+key)
	if err != nil || m == nil || len(m.Data) == 0 {
		return ""
	}
	var v lease.Value
	if json.Unmarshal(m.Data, &v) != nil {
		return ""
	}
	return v.Holder
}
