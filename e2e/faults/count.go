package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// Counting a snapshot against what the scenario did. Every count comes
// from the effect files, the publish acks and the DLQ stream; jetfleet's
// events are used only where they are the subject (missed events, fires,
// resume times) or as evidence in notes.

// letterIndex groups the dead letters by job id.
func (s *snapshot) lettersByJob() map[string][]letter {
	m := map[string][]letter{}
	for _, l := range s.letters {
		m[l.jobID] = append(m[l.jobID], l)
	}
	return m
}

func (s *snapshot) queuedIDs() map[string]bool {
	m := map[string]bool{}
	for _, q := range s.queued {
		m[q.jobID] = true
	}
	return m
}

// jobTally is the fate of published jobs.
type jobTally struct {
	published, runOnce, runTwice, lost, dead int
	// lostIDs, twiceIDs: a few of each, for the notes.
	lostIDs, twiceIDs []string
	// lostQueued: lost jobs still in JOBS at the end.
	lostQueued int
	// twiceAfterKill: jobs run twice with a run on an agent process that
	// was killed afterwards (every process but the last of each agent);
	// twiceSameAttempt: jobs run twice under one attempt number (the
	// message came back as a first delivery).
	twiceAfterKill, twiceSameAttempt int
}

// tallyJobs counts published jobs: run once, run at least twice, dead
// (a dead letter), lost (neither run nor dead-lettered).
// final names each agent's last process ("a1" → "a1.3"); the others were
// killed.
func (s *snapshot) tallyJobs(jobs []publishedJob, final map[string]string) jobTally {
	letters, queued := s.lettersByJob(), s.queuedIDs()
	t := jobTally{published: len(jobs)}
	for _, j := range jobs {
		runs := s.effects.byJob[j.id]
		switch {
		case len(runs) == 1:
			t.runOnce++
		case len(runs) > 1:
			t.runTwice++
			if len(t.twiceIDs) < 5 {
				t.twiceIDs = append(t.twiceIDs, j.id)
			}
			if slices.ContainsFunc(runs, func(x execution) bool { return final[agentOf(x.process)] != x.process }) {
				t.twiceAfterKill++
			}
			if sameAttempt(runs) {
				t.twiceSameAttempt++
			}
		}
		if len(letters[j.id]) > 0 {
			t.dead++
		}
		if len(runs) == 0 && len(letters[j.id]) == 0 {
			t.lost++
			if queued[j.id] {
				t.lostQueued++
			}
			if len(t.lostIDs) < 5 {
				t.lostIDs = append(t.lostIDs, j.id)
			}
		}
	}
	return t
}

func (t jobTally) apply(r *row) {
	r.published, r.runOnce, r.runTwice, r.lost, r.deadLetters = t.published, t.runOnce, t.runTwice, t.lost, t.dead
	if t.runTwice > 0 {
		r.note("run twice: %d, %d of them with a run on an agent process killed later, %d under the same attempt twice (%s…)",
			t.runTwice, t.twiceAfterKill, t.twiceSameAttempt, strings.Join(t.twiceIDs, " "))
	}
	if t.lost > 0 {
		r.note("lost: %s… (%d still in JOBS)", strings.Join(t.lostIDs, " "), t.lostQueued)
	}
}

// pair is one (schedule, nominal time) of an interval schedule.
type pair struct {
	scheduleID string
	nominal    int64
}

// fireTally is the fate of scheduled (schedule, nominal time) pairs.
type fireTally struct {
	// pairs in range (every second of [from, to] for each schedule).
	pairs, once, twice, dupFires, missed int
	// redelivered, firstAgain: pairs run twice from one job message,
	// under a higher attempt (a redelivery), or under the same attempt
	// (the message came back as a first delivery).
	redelivered, firstAgain int
	// missedReported: of the missed pairs, those a `missed` event names.
	missedReported int
	// missedEventPairs: pairs `missed` events name; falseMissed: those
	// that ran (in range or not), in falseMissedEvents events.
	falseMissed, missedEventPairs int
	falseMissedEvents             int
	falseMissedExamples           []string
	// firedTwice: pairs with two stored `fired` events.
	firedTwice int
	// longestGap between two stored `fired` events of one schedule (or
	// the start of the faults and its first, or its last and the stop of
	// the schedulers), and when it began.
	longestGap   time.Duration
	longestGapAt time.Time
	longestGapOf string
}

// tallyFires counts the pairs of schedules (every 1s) with nominal times
// in [from, to]: run once, more than once, missed. A pair run twice is a
// duplicate fire when its job events name two different messages in JOBS
// (stream_sequence), and otherwise a re-run of one message (at-least-once:
// run twice only). The gap search runs from
// gapsFrom (fires before the faults began do not count) to gapsTo (when the
// schedulers stopped: a schedule that stopped firing has a gap up to it).
func (s *snapshot) tallyFires(schedules []string, from, to int64, gapsFrom, gapsTo time.Time) fireTally {
	messages := s.messagesOf()
	runs := map[pair][]execution{}
	for _, xs := range s.effects.byJob {
		for _, x := range xs {
			if x.scheduleID != "" {
				p := pair{x.scheduleID, x.nominal}
				runs[p] = append(runs[p], x)
			}
		}
	}
	missedEvents := map[pair]bool{}
	fired := map[pair]int{}
	firedAt := map[string][]time.Time{}
	var t fireTally
	for _, se := range s.scheduleEvents {
		ev := se.ev
		switch ev.GetType() {
		case protocol.EventMissed:
			last := ev.GetNominalTime().AsTime().Unix()
			falseHere := 0
			for k := int64(0); k < int64(ev.GetCount()); k++ {
				p := pair{ev.GetScheduleId(), last - k} // every 1s: the count seconds up to last
				missedEvents[p] = true
				if len(runs[p]) > 0 {
					falseHere++
				}
			}
			if falseHere > 0 {
				t.falseMissedEvents++
				if len(t.falseMissedExamples) < 3 {
					t.falseMissedExamples = append(t.falseMissedExamples, fmt.Sprintf("%s at %s (count %d, %s, %d ran)",
						ev.GetScheduleId(), ev.GetNominalTime().AsTime().Format(time.TimeOnly), ev.GetCount(), ev.GetReason(), falseHere))
				}
			}
		case protocol.EventFired:
			fired[pair{ev.GetScheduleId(), ev.GetNominalTime().AsTime().Unix()}]++
			if !se.stored.Before(gapsFrom) {
				firedAt[ev.GetScheduleId()] = append(firedAt[ev.GetScheduleId()], se.stored)
			}
		}
	}
	t.missedEventPairs = len(missedEvents)
	for p := range missedEvents {
		if len(runs[p]) > 0 {
			t.falseMissed++
		}
	}
	for _, p := range fired {
		if p > 1 {
			t.firedTwice++
		}
	}
	for _, id := range schedules {
		for n := from; n <= to; n++ {
			p := pair{id, n}
			t.pairs++
			xs := runs[p]
			switch {
			case len(xs) == 0:
				t.missed++
				if missedEvents[p] {
					t.missedReported++
				}
			case len(xs) == 1:
				t.once++
			default:
				t.twice++
				switch {
				case len(messages[xs[0].jobID]) > 1:
					t.dupFires++
				case sameAttempt(xs):
					t.firstAgain++
				default:
					t.redelivered++
				}
			}
		}
	}
	for _, id := range schedules {
		times := append([]time.Time{gapsFrom}, firedAt[id]...)
		slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
		times = append(times, gapsTo)
		for i := 1; i < len(times); i++ {
			if gap := times[i].Sub(times[i-1]); gap > t.longestGap {
				t.longestGap, t.longestGapAt, t.longestGapOf = gap, times[i-1], id
			}
		}
	}
	return t
}

func (t fireTally) apply(r *row) {
	r.falseMissed, r.dupFires, r.missedFires = t.falseMissed, t.dupFires, t.missed
	if t.missedEventPairs > 0 {
		r.note("`missed` events name %d pairs", t.missedEventPairs)
	}
	if t.falseMissed > 0 {
		r.note("false missed: %d pairs in %d `missed` events, e.g. %s", t.falseMissed, t.falseMissedEvents,
			strings.Join(t.falseMissedExamples, "; "))
	}
	if t.missed > 0 {
		r.note("missed fires: %d, of them %d reported by a `missed` event", t.missed, t.missedReported)
	}
	if t.firedTwice > 0 {
		r.note("%d pairs with two `fired` events", t.firedTwice)
	}
	if t.redelivered+t.firstAgain > 0 {
		r.note("%d scheduled jobs ran twice from one message: %d redelivered (a higher attempt), %d delivered as a first delivery again (the same attempt)",
			t.redelivered+t.firstAgain, t.redelivered, t.firstAgain)
	}
	r.note("longest gap between fires %.1fs (%s, from %s)", t.longestGap.Seconds(), t.longestGapOf,
		t.longestGapAt.Format("15:04:05.0"))
}

// messagesOf maps each job id to the JOBS sequences its events name: two
// of them are two job messages of one id.
func (s *snapshot) messagesOf() map[string]map[uint64]bool {
	m := map[string]map[uint64]bool{}
	for _, je := range s.jobEvents {
		if seq := je.ev.GetStreamSequence(); seq != 0 {
			id := je.ev.GetJobId()
			if m[id] == nil {
				m[id] = map[uint64]bool{}
			}
			m[id][seq] = true
		}
	}
	return m
}

// sameAttempt reports whether two executions ran under one attempt number.
func sameAttempt(xs []execution) bool {
	seen := map[int]bool{}
	for _, x := range xs {
		if seen[x.attempt] {
			return true
		}
		seen[x.attempt] = true
	}
	return false
}

// historyVsExecutions compares the supervisor's history records with the
// distinct finished executions: jobs that ran to their end (an end line)
// and left JOBS, and jobs with a dead letter.
func (s *snapshot) historyVsExecutions(r *row) {
	queued := s.queuedIDs()
	finished := map[string]bool{}
	for id := range s.effects.byJob {
		if !queued[id] {
			finished[id] = true
		}
	}
	for _, l := range s.letters {
		finished[l.jobID] = true
	}
	records := map[string]int{}
	for _, x := range s.history {
		records[x.GetJobId()]++
	}
	r.history, r.executions = len(s.history), len(finished)
	if r.history == r.executions {
		return
	}
	var repeated, extra, without int
	var examples []string
	for id, n := range records {
		if n > 1 {
			repeated++
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("%s ×%d", id, n))
			}
		}
		if !finished[id] {
			extra++
		}
	}
	for id := range finished {
		if records[id] == 0 {
			without++
			if len(examples) < 5 {
				examples = append(examples, id+" ×0")
			}
		}
	}
	sort.Strings(examples)
	r.note("history: %d jobs with several records, %d records of no finished execution, %d executions without a record (%s)",
		repeated, extra, without, strings.Join(examples, ", "))
}

// repeatedTerminalEvents counts jobs with more than one stored `succeeded`
// or `dead` event. A job's run ends once: a redelivery after a stored
// `succeeded` is `skipped_duplicate`, after a stored `dead` it is
// terminated again without an event; two are a resent event stored twice.
func (s *snapshot) repeatedTerminalEvents(r *row) {
	n := map[string]int{}
	for _, se := range s.jobEvents {
		if t := se.ev.GetType(); t == protocol.EventSucceeded || t == protocol.EventDead {
			n[t+" "+se.ev.GetJobId()]++
		}
	}
	jobs, extra := 0, 0
	var examples []string
	for k, c := range n {
		if c > 1 {
			jobs++
			extra += c - 1
			if len(examples) < 3 {
				examples = append(examples, fmt.Sprintf("%s ×%d", k, c))
			}
		}
	}
	r.dupEvents = jobs
	if jobs > 0 {
		sort.Strings(examples)
		r.note("%d jobs with repeated succeeded/dead events, %d extra (%s)", jobs, extra, strings.Join(examples, ", "))
	}
}

// concurrency sets the row's max concurrency from the effect files.
func (s *snapshot) concurrency(r *row) {
	n, process := s.effects.peak()
	r.maxConcurrency, r.concurrencyLimit = n, agentConcurrency
	if n > agentConcurrency {
		r.note("agent process %s ran %d programs at once", process, n)
	}
}

// agentOf is the agent id of an effect file's process name ("a1.2" → "a1").
func agentOf(process string) string {
	id, _, _ := strings.Cut(process, ".")
	return id
}
