package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The effect files: each agent process appends to its own file
// (effects/<agent id>.<generation>.log), one line per write, from the exec
// handler's fixed script (fleet.handlers):
//
//	S <job id> <attempt>                                    the program started
//	E <job id> <attempt> <schedule id|-> <nominal time|->   the program finished
//
// Lines of one file are in the order their writes happened.

// execution is one end line: a program that ran to its end.
type execution struct {
	jobID   string
	attempt int
	// scheduleID and nominal (Unix seconds) are set for scheduled jobs.
	scheduleID string
	nominal    int64
	// process is the agent process that ran it ("a1.2").
	process string
}

// effects is what the effect files say.
type effects struct {
	// byJob lists the executions of each job id.
	byJob map[string][]execution
	// started counts start lines; unfinished the start lines without an
	// end (programs killed with their agent).
	started, unfinished int
	// maxConcurrent is, per agent process, the most programs started and
	// not yet finished at one point of its file: a lower bound of what the
	// agent really ran at once.
	maxConcurrent map[string]int
}

func readEffects(dir string) (*effects, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, err
	}
	e := &effects{byJob: map[string][]execution{}, maxConcurrent: map[string]int{}}
	for _, path := range files {
		if err := e.readFile(path); err != nil {
			return nil, err
		}
	}
	return e, nil
}

func (e *effects) readFile(path string) error {
	process := strings.TrimSuffix(filepath.Base(path), ".log")
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	running, peak := 0, 0
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		fields := strings.Fields(s.Text())
		bad := func(why string) error { return fmt.Errorf("%s:%d: %s: %q", path, n, why, s.Text()) }
		switch {
		case len(fields) == 3 && fields[0] == "S":
			e.started++
			running++
			peak = max(peak, running)
		case len(fields) == 5 && fields[0] == "E":
			attempt, err := strconv.Atoi(fields[2])
			if err != nil {
				return bad("attempt is not a number")
			}
			x := execution{jobID: fields[1], attempt: attempt, process: process}
			if fields[3] != "-" {
				t, err := time.Parse(time.RFC3339Nano, fields[4])
				if err != nil {
					return bad("nominal time is not RFC 3339")
				}
				x.scheduleID, x.nominal = fields[3], t.Unix()
			}
			e.byJob[x.jobID] = append(e.byJob[x.jobID], x)
			running = max(running-1, 0)
		default:
			return bad("not a start or end line")
		}
	}
	if err := s.Err(); err != nil {
		return err
	}
	e.unfinished += running
	e.maxConcurrent[process] = peak
	return nil
}

// runs is how often job id ran to its end.
func (e *effects) runs(id string) int { return len(e.byJob[id]) }

// peak is the highest maxConcurrent of any agent process, and which.
func (e *effects) peak() (n int, process string) {
	for p, c := range e.maxConcurrent {
		if c > n || (c == n && p < process) {
			n, process = c, p
		}
	}
	return n, process
}
