package command

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"
)

// A job's program leads its own process group (Setpgid), and every process
// it starts joins that group unless it leaves on purpose (setsid, setpgid).
// The group is what the handler signals: on timeout or cancellation, and
// after the leader exits, so no descendant outlives the attempt.

// pollInterval is how often a group is checked while it is given time to exit.
const pollInterval = 20 * time.Millisecond

// signalGroup sends sig to every process of group pgid.
func signalGroup(pgid int, sig syscall.Signal) error {
	err := syscall.Kill(-pgid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// groupAlive reports whether a process of group pgid still runs. Zombies
// do not count: they are dead, waiting for a parent (init, once orphaned)
// to reap them.
func groupAlive(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	return len(groupMembers(pgid)) > 0
}

// groupMembers lists the live (non-zombie) processes of group pgid, from /proc.
func groupMembers(pgid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		state, group, ok := procStat(pid)
		if ok && group == pgid && state != 'Z' && state != 'X' {
			out = append(out, pid)
		}
	}
	return out
}

// procStat reads the state and process group of pid from /proc/<pid>/stat.
func procStat(pid int) (state byte, pgrp int, ok bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid pgrp …; comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, false
	}
	fields := bytes.Fields(data[i+1:])
	if len(fields) < 3 || len(fields[0]) != 1 {
		return 0, 0, false
	}
	pgrp, err = strconv.Atoi(string(fields[2]))
	if err != nil {
		return 0, 0, false
	}
	return fields[0][0], pgrp, true
}

// waitGroupGone polls until group pgid has no live process or until
// deadline, and reports whether it is gone.
func waitGroupGone(pgid int, deadline time.Time) bool {
	for {
		if !groupAlive(pgid) {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(pollInterval, left))
	}
}

// killGroup ends every process of group pgid: SIGTERM unless termSent says
// when one was sent already, then SIGKILL to what is left once grace has
// passed since. It reports how many processes had to be signalled and
// whether the group is gone.
func killGroup(pgid int, termSent time.Time, grace time.Duration) (left int, gone bool) {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return 0, true
	}
	members := groupMembers(pgid)
	if len(members) == 0 {
		return 0, true
	}
	if termSent.IsZero() {
		termSent = time.Now()
		_ = signalGroup(pgid, syscall.SIGTERM)
	}
	if waitGroupGone(pgid, termSent.Add(grace)) {
		return len(members), true
	}
	_ = signalGroup(pgid, syscall.SIGKILL)
	// SIGKILL cannot be caught; a process in uninterruptible sleep may still
	// take a moment to go.
	return len(members), waitGroupGone(pgid, time.Now().Add(5*time.Second))
}
