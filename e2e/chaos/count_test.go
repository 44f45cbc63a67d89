package main

import (
	"fmt"
	"testing"
	"time"
)

// The counts decide the table: a fire run from two job ids is a duplicate,
// one job id run twice a redelivery, a second with no run a missed fire.
func TestTallyFiresTellsDuplicatesFromRedeliveriesAndMisses(t *testing.T) {
	from := time.Unix(1_000, 0)
	to := from.Add(3 * time.Second) // seconds 1000..1003
	at := func(sec int64) time.Time { return time.Unix(sec, 0).Add(200 * time.Millisecond) }
	execs := []execution{
		{jobID: "a-1000", scheduleID: "a", nominal: 1000, at: at(1000)},
		{jobID: "a-1001", scheduleID: "a", nominal: 1001, at: at(1001)},
		{jobID: "a-1001", scheduleID: "a", nominal: 1001, at: at(1003)}, // redelivered
		{jobID: "a-1002", scheduleID: "a", nominal: 1002, at: at(1002)},
		{jobID: "a-1002-again", scheduleID: "a", nominal: 1002, at: at(1002)}, // fired twice
		// 1003 missed
		{jobID: "a-0999", scheduleID: "a", nominal: 999, at: at(999)}, // outside the window
		{jobID: "plain", at: at(1001)},
	}
	got := tallyFires([]string{"a"}, from, to, execs)
	if got.pairs != 4 || got.once != 1 || got.redelivered != 1 || got.duplicate != 1 || got.missed != 1 {
		t.Fatalf("tally: %+v, want 4 pairs: 1 once, 1 redelivered, 1 duplicate, 1 missed", got)
	}
	if got.latest != 200*time.Millisecond {
		t.Errorf("longest wait: %s, want 200ms (a redelivery's later run does not count)", got.latest)
	}
}

func TestRecoveriesWaitForTwoSecondsAtNinetyPercent(t *testing.T) {
	jobs := map[string]time.Time{}
	var execs []execution
	perSecond := map[int64]int{100: 10, 101: 2, 102: 0, 103: 9, 104: 3, 105: 9, 106: 10}
	n := 0
	for sec, count := range perSecond {
		for range count {
			id := fmt.Sprintf("job-%d", n)
			n++
			jobs[id] = time.Time{}
			execs = append(execs, execution{jobID: id, at: time.Unix(sec, 0)})
		}
	}
	got := recoveries([]time.Time{time.Unix(101, 0)}, jobs, execs, 10, 30*time.Second)
	if len(got) != 1 || got[0] != 4*time.Second {
		t.Fatalf("recoveries: %v, want [4s] (seconds 105 and 106 are the first two at 9 or more of 10)", got)
	}
}
