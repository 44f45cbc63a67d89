package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jetfleet/jetfleet/pkg/bench/workload"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// durabilitySetting is a server setting the durability scenario measures
// jetfleet and raw JetStream on.
type durabilitySetting struct {
	// key ends the names of the setting's figures.
	key   string
	label string
	opts  serverOptions
	// prefetch is the agents' agent.prefetch on this setting.
	prefetch int
	// target of jetfleet's end-to-end rate over raw JetStream's (issue 22).
	target *Target
	// heapTarget of the most jetfleet's phases made the heap grow over
	// what raw JetStream's did (issue 22: within 1.5× where every write is
	// synced).
	heapTarget *Target
}

// durabilitySettings are the settings production chooses between: the
// file store's default sync interval (2 minutes), every write synced on a
// single server, every write synced on a 3-node cluster with R3 streams,
// where nats-server (2.15) syncs each write to the Raft log and the
// stream's store only on flush, and that cluster at the default interval.
// Jetfleet runs each as configured for it: events in atomic batches where
// every write is synced (topology.event_batches), fast batches by default;
// on the cluster the agents prefetch (clusterPrefetch), since a replicated
// consumer sends a job only once its quorum stored the delivery, a round
// trip per job that prefetch hides, where one server sends at once and
// prefetch would only hold more jobs in memory. The single server runs in a
// child process, so that the heap the bench follows is the clients' alone
// (the agents', or raw JetStream's consumers, and the producer's), which
// the memory target is judged on. The cluster's nodes run in the bench's
// process, as issue 22 measures them (in child processes the rates here
// fell by a quarter, raw JetStream's too): its heap figures hold the nodes'
// growth as well, and have no target.
var durabilitySettings = []durabilitySetting{
	{key: "default_sync", label: "default sync interval", opts: serverOptions{embeddedOnly: true, childServer: true}},
	{key: "sync_always", label: "sync_interval always", opts: serverOptions{embeddedOnly: true, childServer: true, syncAlways: true,
		topology: syncedTopology}, target: &Target{AtLeast: true, Value: 0.9}, heapTarget: syncedHeapTarget},
	{key: "r3_sync_always", label: "3 nodes R3, sync_interval always", opts: serverOptions{embeddedOnly: true, syncAlways: true, nodes: 3,
		topology: syncedTopology}, prefetch: clusterPrefetch, target: &Target{AtLeast: true, Value: 0.8}},
	{key: "r3_default_sync", label: "3 nodes R3, default sync interval", opts: serverOptions{embeddedOnly: true, nodes: 3},
		prefetch: clusterPrefetch},
}

// clusterPrefetch is the agents' agent.prefetch on the cluster: with the
// bench's concurrency of 50 an agent then holds up to 500 jobs, as many as
// nats.go's Consume asks for by default (PullMaxMessages).
const clusterPrefetch = 450

// syncedHeapTarget: with every write synced, jetfleet's clients' heap
// grows at most 1.5× as much as raw JetStream's (issue 22).
var syncedHeapTarget = &Target{Value: 1.5}

// syncedTopology is jetfleet's layout for a server that syncs every write.
var syncedTopology = topology.Config{EventBatches: topology.EventBatchesAtomic}

// syncedPerJob is the time a phase on a synced setting allows per job
// beyond its first minute (a floor of 100 jobs/s). phaseTimeout's 2 ms
// (500 jobs/s) is more than one server syncing every write reaches on a
// loaded machine: at 50,000 jobs a phase ran out of it.
const syncedPerJob = 10 * time.Millisecond

func (s durabilitySetting) figure(name, label, unit string, target *Target) figureSpec {
	return figureSpec{name: name + "_" + s.key, label: label + ", " + s.label, unit: unit, target: target}
}

// Figures across settings.
var (
	figDurEnqRatio = figureSpec{name: "enqueue_ratio_always_default", label: "enqueue, sync always / default, jetfleet", unit: UnitRatio}
	figDurE2ERatio = figureSpec{name: "end_to_end_ratio_always_default", label: "end to end, sync always / default, jetfleet",
		unit: UnitRatio}
	figDurE2ER3Ratio = figureSpec{name: "end_to_end_ratio_r3_always_default",
		label: "end to end, 3 nodes R3 sync always / default, jetfleet", unit: UnitRatio}
)

// durability measures one run, for each setting on servers of its own:
// jetfleet's enqueue rate, then the end-to-end rates of raw JetStream
// (DoubleAck, as in throughput) and of jetfleet agents, mirrored (raw,
// jetfleet, jetfleet, raw), their ratio, and the store writes per job of
// each (writes.go).
func (b *bencher) durability(ctx context.Context, run int) error {
	enq := make([]float64, len(durabilitySettings))
	e2e := make([]float64, len(durabilitySettings))
	for i, s := range durabilitySettings {
		res, err := b.durabilityRun(ctx, s)
		if err != nil {
			return fmt.Errorf("%s: %w", s.label, err)
		}
		enq[i], e2e[i] = res.enqueue, res.jetfleet
		b.record(ScenarioDurability, s.figure("enqueue_rate", "enqueue", UnitRate, nil), res.enqueue)
		b.record(ScenarioDurability, s.figure("end_to_end_rate_raw", "end to end, raw", UnitRate, nil), res.raw)
		b.record(ScenarioDurability, s.figure("end_to_end_rate", "end to end, jetfleet", UnitRate, nil), res.jetfleet)
		b.record(ScenarioDurability, s.figure("end_to_end_ratio", "end to end, jetfleet / raw", UnitRatio, s.target), res.jetfleet/res.raw)
		heapOf := "the clients'"
		if !s.opts.childServer {
			heapOf = "the clients' and the nodes'"
		}
		b.record(ScenarioDurability, s.figure("heap_growth_raw", "most "+heapOf+" heap grew, raw", UnitBytes, nil), res.rawHeap)
		b.record(ScenarioDurability, s.figure("heap_growth", "most "+heapOf+" heap grew, jetfleet", UnitBytes, nil), res.ourHeap)
		b.record(ScenarioDurability, s.figure("heap_growth_ratio", "most the heap grew, jetfleet / raw", UnitRatio, s.heapTarget),
			res.ourHeap/max(res.rawHeap, 1))
		b.record(ScenarioDurability, s.figure("agent_stop", "agents' Stop after a phase, longest", UnitMs, nil), float64(res.stop)/float64(time.Millisecond))
		b.record(ScenarioDurability, s.figure("writes_per_job_raw", "store writes per job, raw", UnitWrites, nil), res.rawWrites.total())
		b.record(ScenarioDurability, s.figure("writes_per_job", "store writes per job, jetfleet", UnitWrites, nil), res.ourWrites.total())
		for _, part := range []struct {
			key, label string
			v          float64
		}{
			{"writes_per_job_jobs", "JOBS appends", res.ourWrites.jobsAppends},
			{"writes_per_job_acks", "JOBS acks (removal tombstones)", res.ourWrites.jobsAcks},
			{"writes_per_job_events", "EVENTS appends", res.ourWrites.events},
			{"writes_per_job_kv", "key-value writes (heartbeats, leases, …)", res.ourWrites.keyValue},
		} {
			b.record(ScenarioDurability, s.figure(part.key, "store writes per job, jetfleet: "+part.label, UnitWrites, nil), part.v)
		}
		b.progress("durability run %d, %s: end to end %s jobs/s, raw %s jobs/s (%.2f×); jetfleet %s, raw %s; heap grew %s, raw %s",
			run, s.label, formatValue(res.jetfleet, UnitRate), formatValue(res.raw, UnitRate), res.jetfleet/res.raw, res.ourWrites, res.rawWrites,
			formatValue(res.ourHeap, UnitBytes), formatValue(res.rawHeap, UnitBytes))
	}
	b.record(ScenarioDurability, figDurEnqRatio, enq[1]/enq[0])
	b.record(ScenarioDurability, figDurE2ERatio, e2e[1]/e2e[0])
	b.record(ScenarioDurability, figDurE2ER3Ratio, e2e[2]/e2e[0])
	return nil
}

// durabilityResult is one setting's run.
type durabilityResult struct {
	enqueue, raw, jetfleet float64
	rawWrites, ourWrites   storeWrites
	rawHeap, ourHeap       float64 // the most the heap grew in a phase, bytes
	stop                   time.Duration
}

// durabilityRun runs the phases of one setting on a server (or cluster)
// of its own: jetfleet's enqueue rate, and raw JetStream's and jetfleet's
// end-to-end rates with their writes per job (those of the last of the
// two mirrored phases of each).
func (b *bencher) durabilityRun(ctx context.Context, s durabilitySetting) (durabilityResult, error) {
	var res durabilityResult
	rs, err := b.open(ctx, s.opts)
	if err != nil {
		return res, err
	}
	defer rs.close(ctx)
	tp := &throughputRun{b: b, rs: rs, n: b.cfg.DurabilityJobs, payload: workload.Payload(b.cfg.PayloadSize), prefetch: s.prefetch, countWrites: true,
		followHeap: true}
	if s.opts.syncAlways {
		tp.perJob = syncedPerJob
	}
	if err := tp.setup(); err != nil {
		return res, err
	}
	publishQ := rs.queue("publish")
	if res.enqueue, err = tp.enqueue(ctx, "jetfleet", tp.jobMsg(publishQ)); err != nil {
		return res, err
	}
	if err := tp.purge(ctx, publishQ); err != nil { // nothing consumes them
		return res, err
	}
	rates, err := mirrored([]rateLine{
		{name: "raw", rate: func() (float64, error) { return tp.rawRate(ctx, rs.queue("raw"), true, false) }},
		{name: "jetfleet", rate: func() (float64, error) { return tp.agentRate(ctx, rs.queue("jobs"), true) }},
	})
	if err != nil {
		return res, err
	}
	res.raw, res.jetfleet, res.rawWrites, res.ourWrites = rates[0], rates[1], tp.rawWrites, tp.agentWrites
	res.rawHeap, res.ourHeap, res.stop = tp.rawHeap, tp.agentHeap, tp.agentStop
	return res, nil
}
