package supervisor

import (
	"slices"
	"sort"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
)

// What the tracker shows through the API: agents and the jobs they hold.

// snapshot returns the agents, sorted by id.
func (t *tracker) snapshot(now time.Time) []jetfleet.AgentInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]jetfleet.AgentInfo, 0, len(t.agents))
	for id, a := range t.agents {
		state := jetfleet.AgentAlive
		switch {
		case a.dead:
			state = jetfleet.AgentDead
		case a.hb.GetDraining():
			state = jetfleet.AgentDraining
		}
		info := jetfleet.AgentInfo{ID: id, State: state, Hostname: a.hb.GetHostname(), PID: a.hb.GetPid(), Version: a.hb.GetVersion(),
			Queues: slices.Clone(a.hb.GetQueues()), Kinds: slices.Clone(a.hb.GetKinds()), Capacity: int(a.hb.GetCapacity()),
			Jobs: len(a.hb.GetJobs()), Interval: interval(a.hb), LastSeen: a.lastSeen, SilentFor: now.Sub(a.lastSeen),
			StartedAt: a.hb.GetStartedAt().AsTime()}
		if a.dead {
			// A dead agent runs nothing: its jobs are rescued, or wait
			// for their redelivery (its last heartbeat listed them).
			info.DeadAt, info.Jobs = a.deadAt, 0
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// running returns the jobs live agents hold, with their state.
func (t *tracker) running(now time.Time) []jetfleet.RunningJob {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []jetfleet.RunningJob
	for id, a := range t.agents {
		if a.dead {
			continue
		}
		for _, j := range a.hb.GetJobs() {
			state := "running"
			k := deliveryKey{j.GetStreamSequence(), j.GetDelivered()}
			if st := t.overdue[k]; st != nil {
				state = "cancel_sent"
				if st.failed || st.eventStored {
					state = "timed_out"
				}
			} else if t.ackOverdueLocked(a, j) {
				state = "ack_overdue"
			} else if start, ok := t.starts[k]; ok {
				if timeout, ok := attemptTimeout(j); ok && now.Sub(start) > timeout {
					state = "overdue"
				}
			}
			out = append(out, runningJob(id, j, state))
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].StreamSequence != out[j].StreamSequence {
			return out[i].StreamSequence < out[j].StreamSequence
		}
		return out[i].AgentID < out[j].AgentID
	})
	return out
}

// holders returns the live agents whose latest heartbeat lists jobID.
func (t *tracker) holders(jobID string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for id, a := range t.agents {
		if a.dead {
			continue
		}
		for _, j := range a.hb.GetJobs() {
			if j.GetJobId() == jobID {
				out = append(out, id)
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// heldSequences are the job messages agents not declared dead hold.
func (t *tracker) heldSequences() map[uint64]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[uint64]bool{}
	for _, a := range t.agents {
		if a.dead {
			continue
		}
		for _, j := range a.hb.GetJobs() {
			out[j.GetStreamSequence()] = true
		}
	}
	return out
}

func runningJob(agent string, j *jetfleetpb.InFlightJob, state string) jetfleet.RunningJob {
	r := jetfleet.RunningJob{AgentID: agent, JobID: j.GetJobId(), Queue: j.GetQueue(), Kind: j.GetKind(), Attempt: j.GetAttempt(),
		Delivered: j.GetDelivered(), StreamSequence: j.GetStreamSequence(), State: state}
	if j.GetStartedAt() != nil {
		r.StartedAt = j.GetStartedAt().AsTime()
	}
	if j.GetDeadline() != nil {
		r.Deadline = j.GetDeadline().AsTime()
	}
	if j.GetProgressAt() != nil {
		r.Progress = &jetfleet.Progress{Fraction: j.GetProgress(), Message: j.GetProgressMessage(), Time: j.GetProgressAt().AsTime()}
	}
	return r
}
