package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/jetfleet/jetfleet/pkg/bench"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// JSON output. Every duration the CLI prints in JSON is a string of seconds
// with an "s" suffix ("1.5s"): what jetfleet.Duration writes, and what proto3
// JSON writes in the documents the services return (events, executions,
// dead letters). Some API types of pkg/jetfleet (and bench.Config) carry
// time.Duration fields instead, which encoding/json writes as integer
// nanoseconds; the views below shadow exactly those fields (a field of the
// outer struct wins over the embedded one of the same JSON name), so every
// other field prints as the API type has it. TestJSONViewsCoverEveryDuration
// fails when an API type gains a time.Duration field no view converts.

func printJSON(out io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(data))
	return err
}

type agentJSON struct {
	jetfleet.AgentInfo
	Interval  jetfleet.Duration `json:"interval"`
	SilentFor jetfleet.Duration `json:"silent_for"`
}

func agentsJSON(agents []jetfleet.AgentInfo) []agentJSON {
	out := make([]agentJSON, len(agents))
	for i, a := range agents {
		out[i] = agentJSON{AgentInfo: a, Interval: jetfleet.Duration(a.Interval), SilentFor: jetfleet.Duration(a.SilentFor)}
	}
	return out
}

type queueJSON struct {
	jetfleet.QueueStatus
	AckWait jetfleet.Duration `json:"ack_wait"`
}

func queuesJSON(queues []jetfleet.QueueStatus) []queueJSON {
	out := make([]queueJSON, len(queues))
	for i, q := range queues {
		out[i] = queueJSON{QueueStatus: q, AckWait: jetfleet.Duration(q.AckWait)}
	}
	return out
}

type fleetStatusJSON struct {
	jetfleet.FleetStatus
	Queues []queueJSON `json:"queues"`
}

func statusJSON(st *jetfleet.FleetStatus) fleetStatusJSON {
	return fleetStatusJSON{FleetStatus: *st, Queues: queuesJSON(st.Queues)}
}

type queuesResponseJSON struct {
	jetfleet.QueuesResponse
	Queues []queueJSON `json:"queues"`
}

type queueAddJSON struct {
	jetfleet.QueueAddResponse
	Queue queueJSON `json:"queue"`
}

type historyStatsJSON struct {
	jetfleet.HistoryStats
	P50 jetfleet.Duration `json:"p50"`
	P95 jetfleet.Duration `json:"p95"`
}

type historyJSON struct {
	jetfleet.HistoryResponse
	Stats historyStatsJSON `json:"stats"`
}

func historyResponseJSON(res *jetfleet.HistoryResponse) historyJSON {
	return historyJSON{HistoryResponse: *res, Stats: historyStatsJSON{HistoryStats: res.Stats,
		P50: jetfleet.Duration(res.Stats.P50), P95: jetfleet.Duration(res.Stats.P95)}}
}

// benchConfig is bench.Config without its MarshalJSON, which writes Go
// duration strings ("500ms").
type benchConfig bench.Config

type benchConfigJSON struct {
	benchConfig
	Duration     jetfleet.Duration `json:"duration"`
	ScheduleLead jetfleet.Duration `json:"schedule_lead"`
	LeaseTTL     jetfleet.Duration `json:"lease_ttl"`
}

type benchReportJSON struct {
	*bench.Report
	Config benchConfigJSON `json:"config"`
}

func benchJSON(r *bench.Report) benchReportJSON {
	c := r.Config
	return benchReportJSON{Report: r, Config: benchConfigJSON{benchConfig: benchConfig(c), Duration: jetfleet.Duration(c.Duration),
		ScheduleLead: jetfleet.Duration(c.ScheduleLead), LeaseTTL: jetfleet.Duration(c.LeaseTTL)}}
}
