package scheduler_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetfleet/jetfleet/pkg/clock"
	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
	"github.com/jetfleet/jetfleet/pkg/protocol/jetfleetpb"
	"github.com/jetfleet/jetfleet/pkg/scheduler"
	"github.com/jetfleet/jetfleet/pkg/topology"
)

// runFixture is a leader on a fake clock at overlapStart and schedules on
// queue default, kind work, with no agent: the tests write the job events.
type runFixture struct {
	f      *fleet
	clk    *clock.Fake
	r      *replica
	events *scheduleEvents
}

func newRunFixture(t *testing.T) *runFixture {
	f := newFleet(t, topology.Config{})
	rf := &runFixture{f: f, clk: clock.NewFake(utc(overlapStart)), events: watchScheduleEvents(t, f.nc)}
	rf.r = f.replica(scheduler.Config{}, rf.clk)
	waitLeading(t, rf.r)
	return rf
}

// add stores a schedule firing every d with overlap policy.
func (rf *runFixture) add(t *testing.T, id string, d time.Duration, policy string) {
	t.Helper()
	def := interval(id, d, "work")
	def.Policy.Overlap = policy
	_, err := rf.f.client.AddSchedule(ctx(t, 10*time.Second), def)
	require.NoError(t, err)
	require.NoError(t, rf.r.WaitSynced(ctx(t, 10*time.Second)))
}

// at moves the clock to overlapStart + d and lets the leader act.
func (rf *runFixture) at(t *testing.T, d time.Duration) {
	t.Helper()
	rf.clk.Set(utc(overlapStart).Add(d))
	require.NoError(t, rf.r.Kick(ctx(t, 10*time.Second)))
}

// jobSeq is the sequence of jobID's message in JOBS.
func (f *fleet) jobSeq(t *testing.T, jobID string) uint64 {
	t.Helper()
	for _, m := range f.jobMessages(t) {
		if m.id == jobID {
			return m.seq
		}
	}
	t.Fatalf("job %s is not in JOBS", jobID)
	return 0
}

// removeJob deletes a job message from JOBS, as an ack or a TERM does.
func (f *fleet) removeJob(t *testing.T, seq uint64) {
	t.Helper()
	c := ctx(t, 10*time.Second)
	st, err := f.js.Stream(c, protocol.StreamJobs)
	require.NoError(t, err)
	require.NoError(t, st.DeleteMsg(c, seq))
}

// publishJobEvent stores an event of type typ about jobID (queue default,
// kind work), whose JOBS message is seq.
func (f *fleet) publishJobEvent(t *testing.T, jobID string, seq uint64, typ string) {
	t.Helper()
	ev := &jetfleetpb.JobEvent{Type: typ, JobId: jobID, Queue: "default", Kind: "work", Attempt: 1, AgentId: "agent-gone",
		Time: timestamppb.Now(), StreamSequence: seq}
	data, err := protocol.Marshal(ev)
	require.NoError(t, err)
	_, err = f.js.Publish(ctx(t, 10*time.Second), protocol.JobEventSubject("default", "work", typ, jobID), data)
	require.NoError(t, err)
}

// TestNewLeaderSeesARunEndWhateverEventCameLast: a run's end is read from
// the events that end a run (succeeded, skipped_duplicate, dead), each on its
// own subject, not from the job's latest event, which a late started, a
// resent event or the supervisor's rescued can follow. An end event about
// another JOBS message (a reused job id) does not end the run.
func TestNewLeaderSeesARunEndWhateverEventCameLast(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		events []string // in the order they are stored
		other  bool     // the events are about another JOBS message
		over   bool
	}{
		{"started stored after succeeded", []string{protocol.EventSucceeded, protocol.EventStarted}, false, true},
		{"rescued stored after succeeded", []string{protocol.EventSucceeded, protocol.EventRescued}, false, true},
		{"retrying resent after dead", []string{protocol.EventRetrying, protocol.EventFailed, protocol.EventDead, protocol.EventRetrying}, false, true},
		{"skipped_duplicate", []string{protocol.EventStarted, protocol.EventSkippedDuplicate}, false, true},
		{"succeeded about another message", []string{protocol.EventSucceeded}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rf := newRunFixture(t)
			rf.add(t, "ov", 10*time.Second, jetfleet.OverlapSkip)
			rf.at(t, 10*time.Second)
			job := nominalJob(10 * time.Second)
			seq := rf.f.jobSeq(t, job)

			// The events arrive while no replica leads.
			rf.r.stop()
			evSeq := seq
			if tt.other {
				evSeq = seq + 1000
			}
			for _, typ := range tt.events {
				rf.f.publishJobEvent(t, job, evSeq, typ)
			}
			if tt.over {
				rf.f.removeJob(t, seq)
			}
			rf.r = rf.f.replica(scheduler.Config{}, rf.clk)
			waitLeading(t, rf.r)

			rf.at(t, 20*time.Second)
			if tt.over {
				fired := rf.events.waitN(t, "ov", protocol.EventFired, 2)
				assert.Equal(t, utc(overlapStart).Add(20*time.Second), fired[1].GetNominalTime().AsTime())
				assert.Empty(t, rf.events.of("ov", protocol.EventSkipped))
				return
			}
			skipped := rf.events.waitN(t, "ov", protocol.EventSkipped, 1)
			assert.Equal(t, "overlap", skipped[0].GetReason())
			assert.Len(t, rf.events.of("ov", protocol.EventFired), 1)
		})
	}
}

// TestSkippedDuplicateEndsARun: the leader's completion watch takes
// skipped_duplicate, like succeeded and dead, as the end of a run.
func TestSkippedDuplicateEndsARun(t *testing.T) {
	t.Parallel()
	rf := newRunFixture(t)
	rf.add(t, "ov", 10*time.Second, jetfleet.OverlapSkip)
	rf.at(t, 10*time.Second)
	job := nominalJob(10 * time.Second)
	seq := rf.f.jobSeq(t, job)
	rf.f.removeJob(t, seq)
	rf.f.publishJobEvent(t, job, seq, protocol.EventSkippedDuplicate)
	rf.f.waitState(t, "ov", func(st map[string]any) bool { return st["running_job_id"] == nil })
	rf.at(t, 20*time.Second)
	rf.events.waitN(t, "ov", protocol.EventFired, 2)
	assert.Empty(t, rf.events.of("ov", protocol.EventSkipped))
}

// TestRunThatLeftJOBSWithoutAnEndIsAbandoned: a run whose job is gone from
// JOBS and that no event ended within the grace no longer blocks its
// schedule; a run whose job is still in JOBS keeps blocking it.
func TestRunThatLeftJOBSWithoutAnEndIsAbandoned(t *testing.T) {
	t.Parallel()
	rf := newRunFixture(t)
	rf.add(t, "lost", time.Hour, jetfleet.OverlapSkip)
	rf.add(t, "kept", time.Hour, jetfleet.OverlapSkip)
	c := ctx(t, 30*time.Second)
	rf.at(t, time.Hour) // 11:00: both fire
	lostJob, keptJob := "sched.lost."+itoa(utc(overlapStart).Add(time.Hour).Unix()), "sched.kept."+itoa(utc(overlapStart).Add(time.Hour).Unix())
	rf.f.removeJob(t, rf.f.jobSeq(t, lostJob)) // gone, and no event will ever say how it ended

	require.NoError(t, rf.r.CheckRuns(c))
	info, err := rf.f.client.GetSchedule(c, "lost")
	require.NoError(t, err)
	assert.Equal(t, lostJob, info.State.RunningJobID, "still waiting within the grace")

	rf.clk.Set(utc(overlapStart).Add(time.Hour + scheduler.DefaultLostRunGrace))
	require.NoError(t, rf.r.CheckRuns(c))
	skipped := rf.events.waitN(t, "lost", protocol.EventSkipped, 1)
	assert.Equal(t, "run_lost", skipped[0].GetReason())
	assert.Equal(t, lostJob, skipped[0].GetJobId())
	assert.Equal(t, utc(overlapStart).Add(time.Hour), skipped[0].GetNominalTime().AsTime())
	rf.f.waitState(t, "lost", func(st map[string]any) bool { return st["running_job_id"] == nil })
	info, err = rf.f.client.GetSchedule(c, "kept")
	require.NoError(t, err)
	assert.Equal(t, keptJob, info.State.RunningJobID, "its job is still in JOBS")

	rf.at(t, 2*time.Hour)
	fired := rf.events.waitN(t, "lost", protocol.EventFired, 2)
	assert.Equal(t, utc(overlapStart).Add(2*time.Hour), fired[1].GetNominalTime().AsTime())
	kept := rf.events.waitN(t, "kept", protocol.EventSkipped, 1)
	assert.Equal(t, "overlap", kept[0].GetReason())
}

// TestCancelPreviousRemovesARunBetweenAttempts: the previous run failed once
// and waits for its retry in JOBS, so no agent can cancel it. The scheduler
// deletes its message from JOBS and records it, and it never runs again
// beside the newer run.
func TestCancelPreviousRemovesARunBetweenAttempts(t *testing.T) {
	t.Parallel()
	first, second := nominalJob(10*time.Second), nominalJob(20*time.Second)
	o := newOverlapFixtureWith(t, jetfleet.OverlapCancelPrevious, func(ctx context.Context, job protocol.Job) error {
		if job.ID == first {
			return errRetry{delay: time.Hour}
		}
		<-ctx.Done()
		return ctx.Err()
	})
	o.at(t, 10*time.Second)
	o.jobs.waitFor(t, first, protocol.EventRetrying)
	// The retrying event goes out before the NAK: until the runner lets go,
	// a cancel reaches it holding the job instead of finding it in JOBS.
	require.Eventually(t, func() bool { return !o.run.holds(first) }, 10*time.Second, 5*time.Millisecond,
		"the runner hands the first run back")
	seq := o.f.jobSeq(t, first)

	o.at(t, 20*time.Second)
	skipped := o.events.waitN(t, "ov", protocol.EventSkipped, 1)
	assert.Equal(t, "cancel_previous", skipped[0].GetReason())
	assert.Equal(t, first, skipped[0].GetJobId())
	assert.Equal(t, utc(overlapStart).Add(10*time.Second), skipped[0].GetNominalTime().AsTime())
	c := ctx(t, 10*time.Second)
	st, err := o.f.js.Stream(c, protocol.StreamJobs)
	require.NoError(t, err)
	_, err = st.GetMsg(c, seq)
	assert.ErrorIs(t, err, jetstream.ErrMsgNotFound, "the previous run is no longer in JOBS")

	o.run.waitStarted(second)
	fired := o.events.waitN(t, "ov", protocol.EventFired, 2)
	assert.Equal(t, "cancel_previous "+first, fired[1].GetReason())
	assert.Equal(t, 1, o.run.attemptsOf(first))
}
