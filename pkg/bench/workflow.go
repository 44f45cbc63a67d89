package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/jetfleet/jetfleet/pkg/agent"
	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Figures of the workflow scenario.
var (
	figWorkflowPlain = figureSpec{name: "workflow_plain_rate", label: "N plain no-op jobs: publish → last handler done",
		unit: UnitRate}
	figWorkflowFanOut = figureSpec{name: "workflow_fanout_rate", label: "one run fanning out N no-op jobs: start → run stored as ended",
		unit: UnitRate}
	figWorkflowHandled = figureSpec{name: "workflow_fanout_handled_rate", label: "one run fanning out N no-op jobs: start → last handler done",
		unit: UnitRate}
	figWorkflowRatio = figureSpec{name: "workflow_wall_time_ratio", label: "wall time, fan-out / plain jobs", unit: UnitRatio,
		target: &Target{Value: 1.5}}
	figWorkflowState     = figureSpec{name: "workflow_run_state_bytes", label: "the ended run's stored state", unit: UnitBytes}
	figWorkflowHeapPlain = figureSpec{name: "workflow_plain_peak_heap", label: "fleet live heap, peak: N plain jobs",
		unit: UnitBytes}
	figWorkflowHeapFanOut = figureSpec{name: "workflow_fanout_peak_heap", label: "fleet live heap, peak: one run fanning out N",
		unit: UnitBytes}
	figWorkflowMemory = figureSpec{name: "workflow_orchestration_heap", label: "orchestration's memory (peak heap, fan-out − plain)",
		unit: UnitBytes}
)

// workflow measures what orchestration costs: N plain no-op jobs published
// at once and run by the agents, then one workflow run whose single step
// fans out N no-op jobs on the same agents, from its start until the
// supervisor stored it as ended (every element's event read and applied).
// Both on one server, side by side. The server runs in a child process, so
// this process's live heap is the fleet's (agents, supervisor, producer):
// its peak in each phase, the fan-out's minus the plain jobs', is what the
// orchestration holds.
func (b *bencher) workflow(ctx context.Context, run int) error {
	rs, err := b.open(ctx, serverOptions{ownFleet: true, childServer: true})
	if err != nil {
		return err
	}
	defer rs.close(ctx)
	n := b.cfg.FanOut
	ctx, cancel := context.WithTimeout(ctx, 2*phaseTimeout(n))
	defer cancel()

	queue := rs.queue("workflow")
	var handled atomic.Int64
	target := atomic.Int64{}
	reached := make(chan struct{}, 1)
	handler := func(context.Context, *agent.Job) error {
		if handled.Add(1) == target.Load() {
			reached <- struct{}{}
		}
		return nil
	}
	sup, err := b.startSupervisor(ctx, rs)
	if err != nil {
		return err
	}
	defer func() { _ = sup.Stop(context.WithoutCancel(ctx)) }()
	fleet, err := newAgents(rs, "agent", queue, kindNoop, b.cfg.Agents, b.cfg.Concurrency, b.cfg.Prefetch, handler)
	if err != nil {
		return err
	}
	defer func() { _ = fleet.stop(ctx) }()
	if err := fleet.start(ctx); err != nil {
		return err
	}
	producer, err := rs.connect("producer")
	if err != nil {
		return err
	}
	client := jetfleet.NewClient(producer.Conn)

	// Plain jobs.
	b.progress("workflow run %d: %d plain jobs", run, n)
	target.Store(int64(n))
	payload := workload.Payload(b.cfg.PayloadSize)
	heap := startHeapPeak()
	start := time.Now()
	if err := publish(ctx, producer.Conn, n, func(i int) *nats.Msg {
		msg, _ := protocol.Job{ID: "plain-" + strconv.Itoa(i), Queue: queue, Kind: kindNoop, Payload: payload}.Msg()
		return msg
	}); err != nil {
		return fmt.Errorf("publish %d plain jobs: %w", n, err)
	}
	select {
	case <-reached:
	case <-ctx.Done():
		return fmt.Errorf("plain jobs: %d of %d handled: %w", handled.Load(), n, ctx.Err())
	}
	plainRate := float64(n) / time.Since(start).Seconds()
	// The supervisor's history of the plain jobs is not the fan-out's work.
	if err := waitEventsRead(ctx, producer.JetStream); err != nil {
		return err
	}
	plainHeap := heap.stop()

	// One run fanning out as many.
	b.progress("workflow run %d: a fan-out of %d", run, n)
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	list, err := json.Marshal(items)
	if err != nil {
		return err
	}
	name := "bench-" + b.id
	def := &protocol.WorkflowDefinition{Name: name, Steps: []protocol.WorkflowStep{
		{Name: "each", Kind: kindNoop, Queue: queue, ForEach: list, Input: json.RawMessage(`{"i":"{{item}}"}`)}}}
	if _, err := client.AddWorkflow(ctx, def); err != nil {
		return err
	}
	defer func() { _ = client.RemoveWorkflow(context.WithoutCancel(ctx), name) }()
	handled.Store(0)
	target.Store(int64(n))
	heap = startHeapPeak()
	start = time.Now()
	started, err := client.RunWorkflow(ctx, name, nil)
	if err != nil {
		return err
	}
	// When the agents are done with the elements, apart from when the
	// supervisor has read and applied all of their events.
	handledAt := make(chan float64, 1)
	go func() {
		select {
		case <-reached:
			handledAt <- float64(n) / time.Since(start).Seconds()
		case <-ctx.Done():
		}
	}()
	ended, err := client.WaitWorkflowRun(ctx, started.RunID)
	if err != nil {
		return fmt.Errorf("fan-out: %d of %d handled: %w", handled.Load(), n, err)
	}
	fanOutRate := float64(n) / time.Since(start).Seconds()
	fanOutHeap := heap.stop()
	var handledRate float64
	select {
	case handledRate = <-handledAt: // the last handler returned before its event ended the run
	case <-ctx.Done():
		return ctx.Err()
	}
	if ended.Status != jetfleet.WorkflowSucceeded {
		return fmt.Errorf("fan-out run %s ended %s: %+v", ended.RunID, ended.Status, ended.Failures)
	}
	runs, err := producer.JetStream.KeyValue(ctx, protocol.BucketWorkflowRuns)
	if err != nil {
		return err
	}
	state, err := runs.Get(ctx, started.RunID)
	if err != nil {
		return err
	}
	_ = runs.Delete(context.WithoutCancel(ctx), started.RunID)

	b.record(ScenarioWorkflow, figWorkflowPlain, plainRate)
	b.record(ScenarioWorkflow, figWorkflowHandled, handledRate)
	b.record(ScenarioWorkflow, figWorkflowFanOut, fanOutRate)
	b.record(ScenarioWorkflow, figWorkflowRatio, plainRate/fanOutRate)
	b.record(ScenarioWorkflow, figWorkflowState, float64(len(state.Value())))
	b.record(ScenarioWorkflow, figWorkflowHeapPlain, float64(plainHeap))
	b.record(ScenarioWorkflow, figWorkflowHeapFanOut, float64(fanOutHeap))
	b.record(ScenarioWorkflow, figWorkflowMemory, float64(fanOutHeap)-float64(plainHeap))
	b.progress("workflow run %d: plain %.0f jobs/s, fan-out %.0f jobs/s", run, plainRate, fanOutRate)
	return nil
}

// heapPeak follows this process's live heap (as of each collection) while a
// phase runs, from a collection at its start.
type heapPeak struct {
	done chan struct{}
	peak chan uint64
}

func startHeapPeak() *heapPeak {
	runtime.GC()
	h := &heapPeak{done: make(chan struct{}), peak: make(chan uint64, 1)}
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	go func() {
		var peak uint64
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			metrics.Read(sample)
			peak = max(peak, sample[0].Value.Uint64())
			select {
			case <-h.done:
				h.peak <- peak
				return
			case <-tick.C:
			}
		}
	}()
	return h
}

// stop ends the phase and returns its peak live heap.
func (h *heapPeak) stop() uint64 {
	close(h.done)
	return <-h.peak
}
