package agent

import (
	"context"
	"os"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/telemetry"
)

// kickSpacing is the least time between two heartbeats that deliveries
// asked for.
const kickSpacing = 100 * time.Millisecond

// heartbeatLoop publishes a heartbeat every interval, registering it in the
// agents bucket, and one soon after new deliveries, so the supervisor knows
// a job this agent holds even if the agent dies before the next interval.
func (a *Agent) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	a.publishHeartbeat(true)
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.publishHeartbeat(true)
			last = time.Now()
		case <-a.hbKick:
			if wait := kickSpacing - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
			a.publishHeartbeat(false)
			last = time.Now()
		}
	}
}

// kickHeartbeat asks for a heartbeat soon; it never blocks.
func (a *Agent) kickHeartbeat() {
	select {
	case a.hbKick <- struct{}{}:
	default:
	}
}

// heartbeat describes the agent and every job it holds.
func (a *Agent) heartbeat() *jetfleetpb.Heartbeat {
	a.mu.Lock()
	jobs := make([]*jetfleetpb.InFlightJob, 0, len(a.inflight))
	for _, ex := range a.inflight {
		jobs = append(jobs, ex.inFlight())
	}
	a.mu.Unlock()
	sort.Slice(jobs, func(i, j int) bool { return jobs[i].GetStreamSequence() < jobs[j].GetStreamSequence() })
	return &jetfleetpb.Heartbeat{
		AgentId: a.cfg.ID, Hostname: hostname(), Pid: int64(os.Getpid()), Version: Version,
		StartedAt: timestamppb.New(a.startedAt), SentAt: timestamppb.Now(),
		Interval: durationpb.New(a.cfg.HeartbeatInterval), Queues: a.cfg.Queues, Capacity: int32(a.cfg.Concurrency),
		Draining: a.draining.Load(), Jobs: jobs, Sequence: a.hbSeq.Add(1), Kinds: a.Kinds(),
	}
}

// publishHeartbeat sends one heartbeat and, with register, puts it in the
// agents bucket too.
func (a *Agent) publishHeartbeat(register bool) {
	data, err := protocol.Marshal(a.heartbeat())
	if err != nil {
		a.logger.Error("encode heartbeat", telemetry.LogError, err)
		return
	}
	if err := a.nc.Publish(protocol.HeartbeatSubject(a.cfg.ID), data); err != nil {
		a.logger.Warn("heartbeat not sent", telemetry.LogError, err)
	}
	if register {
		if _, err := a.js.PublishAsync("$KV."+protocol.BucketAgents+"."+a.cfg.ID, data); err != nil {
			a.logger.Warn("agent registration not sent", telemetry.LogError, err)
		}
	}
}
