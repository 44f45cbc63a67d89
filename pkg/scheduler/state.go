package scheduler

import (
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// schedState is the compact in-memory form of State.
type schedState struct {
	lastNominal  int64 // math.MinInt64 when none
	lastJobID    string
	lastFireNom  int64
	lastFiredAt  int64 // Unix nanoseconds
	running      string
	runningSeq   uint64
	buffered     int64 // 0 when none
	eventSeq     uint64
	pending      map[int64]uint32
	fires, skips uint64
	misses       uint64
	done         bool
}

func newRuntime() schedState { return schedState{lastNominal: math.MinInt64} }

func unixOrMin(t time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64
	}
	return t.Unix()
}

func fromState(s *jetfleet.ScheduleState) schedState {
	r := schedState{
		lastNominal: unixOrMin(s.LastNominal),
		running:     s.RunningJobID, runningSeq: s.RunningSequence,
		eventSeq: s.EventSequence,
		fires:    s.Fires, skips: s.Skips, misses: s.Misses,
		done: s.Done,
	}
	if !s.Buffered.IsZero() {
		r.buffered = s.Buffered.Unix()
	}
	if s.LastFire != nil {
		r.lastJobID = s.LastFire.JobID
		r.lastFireNom = s.LastFire.NominalTime.Unix()
		r.lastFiredAt = s.LastFire.FiredAt.UnixNano()
	}
	if len(s.Pending) > 0 {
		r.pending = make(map[int64]uint32, len(s.Pending))
		for k, v := range s.Pending {
			if n, err := strconv.ParseInt(k, 10, 64); err == nil {
				r.pending[n] = v
			}
		}
	}
	return r
}

func (r *schedState) toState(id string, now time.Time) *jetfleet.ScheduleState {
	s := &jetfleet.ScheduleState{ScheduleID: id, RunningJobID: r.running, RunningSequence: r.runningSeq, EventSequence: r.eventSeq,
		Fires: r.fires, Skips: r.skips, Misses: r.misses, Done: r.done, UpdatedAt: now.UTC()}
	if r.lastNominal != math.MinInt64 {
		s.LastNominal = time.Unix(r.lastNominal, 0).UTC()
	}
	if r.buffered != 0 {
		s.Buffered = time.Unix(r.buffered, 0).UTC()
	}
	if r.lastJobID != "" {
		s.LastFire = &jetfleet.ScheduleFire{JobID: r.lastJobID, NominalTime: time.Unix(r.lastFireNom, 0).UTC(), FiredAt: time.Unix(0, r.lastFiredAt).UTC()}
	}
	if len(r.pending) > 0 {
		s.Pending = make(map[string]uint32, len(r.pending))
		for k, v := range r.pending {
			s.Pending[strconv.FormatInt(k, 10)] = v
		}
	}
	return s
}

// afterMarker is the state that follows a delete or purge marker on the
// state key. The markers come from rm, whose definition delete the
// definition watch may deliver after the marker, and from add clearing what
// an earlier schedule of the id left. Neither may make a schedule whose
// definition is live (live) handle again what it handled — fire nominal
// times again, or messages of its event stream — so its cursors stay; the
// rest starts over.
func (r schedState) afterMarker(live bool) schedState {
	fresh := newRuntime()
	if live {
		fresh.lastNominal, fresh.eventSeq, fresh.done = r.lastNominal, r.eventSeq, r.done
	}
	return fresh
}

// clone copies r deeply enough to be changed without touching r.
func (r schedState) clone() schedState {
	if r.pending != nil {
		p := make(map[int64]uint32, len(r.pending))
		for k, v := range r.pending {
			p[k] = v
		}
		r.pending = p
	}
	return r
}

func decodeState(data []byte) (schedState, error) {
	var s jetfleet.ScheduleState
	if err := json.Unmarshal(data, &s); err != nil {
		return schedState{}, err
	}
	return fromState(&s), nil
}

func sortedKeys(m map[int64]uint32) []int64 {
	keys := make([]int64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}
