package main

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// jobTally is the fate of the jobs JetStream acknowledged.
type jobTally struct {
	published, once, twice, lost int
	lostIDs                      []string
	twiceIDs                     []string // with when each run began
}

func tallyJobs(published map[string]time.Time, rec *recorder) jobTally {
	t := jobTally{published: len(published)}
	ids := make([]string, 0, len(published))
	for id := range published {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		switch n := rec.runs(id); {
		case n == 0:
			t.lost++
			if len(t.lostIDs) < 5 {
				t.lostIDs = append(t.lostIDs, id)
			}
		case n == 1:
			t.once++
		default:
			t.twice++
			if len(t.twiceIDs) < 5 {
				t.twiceIDs = append(t.twiceIDs, rec.describe(id))
			}
		}
	}
	return t
}

// fireTally is the fate of every (schedule, nominal second) in a window.
type fireTally struct {
	pairs, once, redelivered, duplicate, missed int
	// latest is the longest wait from a nominal time to its first
	// effect; latestAt names the nominal time.
	latest   time.Duration
	latestAt time.Time
	examples []string
}

// tallyFires counts, for every schedule and every second of [from, to],
// the executions the recorder saw: one is right; several of one job id is
// a redelivery (counted with the jobs run twice); several job ids is a
// duplicate fire; none is a missed fire.
func tallyFires(schedules []string, from, to time.Time, execs []execution) fireTally {
	type pairKey struct {
		schedule string
		nominal  int64
	}
	byPair := map[pairKey][]execution{}
	for _, x := range execs {
		if x.scheduleID != "" {
			k := pairKey{x.scheduleID, x.nominal}
			byPair[k] = append(byPair[k], x)
		}
	}
	var t fireTally
	for _, s := range schedules {
		for sec := from.Unix(); sec <= to.Unix(); sec++ {
			t.pairs++
			xs := byPair[pairKey{s, sec}]
			if len(xs) == 0 {
				t.missed++
				if len(t.examples) < 5 {
					t.examples = append(t.examples, fmt.Sprintf("missed %s@%s", s, time.Unix(sec, 0).UTC().Format("15:04:05")))
				}
				continue
			}
			jobs := map[string]bool{}
			first := xs[0].at
			for _, x := range xs {
				jobs[x.jobID] = true
				if x.at.Before(first) {
					first = x.at
				}
			}
			switch {
			case len(jobs) > 1:
				t.duplicate++
				if len(t.examples) < 5 {
					t.examples = append(t.examples, fmt.Sprintf("fired twice %s@%s", s, time.Unix(sec, 0).UTC().Format("15:04:05")))
				}
			case len(xs) > 1:
				t.redelivered++
			default:
				t.once++
			}
			if wait := first.Sub(time.Unix(sec, 0)); wait > t.latest {
				t.latest, t.latestAt = wait, time.Unix(sec, 0)
			}
		}
	}
	return t
}

// row is one scenario's line of the table.
type row struct {
	scenario string
	load     string
	faults   string
	jobs     jobTally
	fires    fireTally
	// recover is the scenario's recovery figure, in words.
	recover string
	notes   []string
	// failures are the targets the scenario missed.
	failures []string
	err      error
}

func (r *row) note(format string, args ...any) {
	r.notes = append(r.notes, fmt.Sprintf(format, args...))
}

func (r *row) fail(format string, args ...any) {
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
}

// checkNoLoss is the target of every scenario: nothing acknowledged is
// lost, no schedule fires twice, none misses a fire.
func (r *row) checkNoLoss() {
	if r.jobs.lost > 0 {
		r.fail("%d acknowledged jobs never ran (%s…)", r.jobs.lost, strings.Join(r.jobs.lostIDs, " "))
	}
	if r.fires.duplicate > 0 {
		r.fail("%d duplicate fires", r.fires.duplicate)
	}
	if r.fires.missed > 0 {
		r.fail("%d missed fires (%s)", r.fires.missed, strings.Join(r.fires.examples, ", "))
	}
}

// effectRate is the load's jobs run per second in [from, to) (first runs).
func effectRate(jobs map[string]time.Time, execs []execution, from, to time.Time) int {
	n := 0
	seen := map[string]bool{}
	for _, x := range execs {
		if _, ok := jobs[x.jobID]; ok && !seen[x.jobID] && !x.at.Before(from) && x.at.Before(to) {
			seen[x.jobID] = true
			n++
		}
	}
	if secs := to.Sub(from).Seconds(); secs >= 1 {
		return int(float64(n) / secs)
	}
	return 0
}

// recoveries finds, for every fault time, how long the effects of the
// load's jobs took to come back to at least 90% of rate per second.
func recoveries(faults []time.Time, jobs map[string]time.Time, execs []execution, rate int, within time.Duration) []time.Duration {
	perSecond := map[int64]int{}
	seen := map[string]bool{}
	for _, x := range execs {
		if _, ok := jobs[x.jobID]; ok && !seen[x.jobID] {
			seen[x.jobID] = true
			perSecond[x.at.Unix()]++
		}
	}
	need := rate * 9 / 10
	var out []time.Duration
	for _, f := range faults {
		took := time.Duration(-1)
		for sec := f.Unix(); sec <= f.Add(within).Unix()+30; sec++ {
			if perSecond[sec] >= need && perSecond[sec+1] >= need {
				took = max(0, time.Unix(sec, 0).Sub(f))
				break
			}
		}
		out = append(out, took)
	}
	return out
}
