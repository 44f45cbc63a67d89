package scheduler

import (
	"math"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
)

// A trigger yields the nominal fire times of a time-based schedule, as Unix
// seconds. next returns the first nominal time strictly after after, and
// false when there is none.
type trigger interface {
	next(after int64) (int64, bool)
}

const (
	day = 24 * 60 * 60
	// maxCronSteps bounds the civil times examined by one cronTrigger.next
	// call. A fall-back of one hour with a per-second spec needs 3,600.
	maxCronSteps = 100_000
)

// cronTrigger fires at the civil (wall-clock) times of a cron spec in a time
// zone, with the DST policy of docs/scheduling.md:
//
//   - a civil time that does not exist (spring-forward gap) fires once, at
//     the instant it names under the offset in force before the gap, that is
//     shifted forward by the length of the gap;
//   - a civil time that exists twice (fall-back) fires once, at its first
//     occurrence;
//   - two civil times that land on the same instant fire once.
//
// The spec itself is matched against civil time by robfig/cron running in
// UTC, where no transition exists; the zone is applied afterwards.
type cronTrigger struct {
	spec cron.SpecSchedule // Location is time.UTC: it iterates civil time
	loc  *time.Location
}

func (c *cronTrigger) next(after int64) (int64, bool) {
	lo, _ := offsetRange(c.loc, after-2*day, after+2*day)
	// A civil time civ maps to an instant civ-o for one of the zone's
	// offsets o, so only civil times after after+lo can map after after.
	cur := time.Unix(after+int64(lo), 0).UTC()
	var best int64
	var hi int
	found := false
	for range maxCronSteps {
		cur = c.spec.Next(cur)
		if cur.IsZero() {
			break
		}
		civ := cur.Unix()
		if found && civ-int64(hi) >= best {
			break // later civil times map to later instants
		}
		x := resolveCivil(c.loc, civ)
		if x > after && (!found || x < best) {
			best, found = x, true
			_, hi = offsetRange(c.loc, best-2*day, best+2*day)
		}
		if found && civ-int64(hi) >= best {
			break
		}
	}
	return best, found
}

// intervalTrigger fires at origin + k·every for every integer k.
type intervalTrigger struct {
	origin, every int64
}

func (i *intervalTrigger) next(after int64) (int64, bool) {
	d := after - i.origin
	k := d / i.every
	if d < 0 && d%i.every != 0 {
		k-- // floor division
	}
	k++
	if k > 0 && k > (math.MaxInt64-i.origin)/i.every {
		return 0, false
	}
	return i.origin + k*i.every, true
}

// onceTrigger fires once, at at.
type onceTrigger struct {
	at int64
}

func (o *onceTrigger) next(after int64) (int64, bool) {
	if o.at > after {
		return o.at, true
	}
	return 0, false
}

// zonePeriod is a span of instants [start, end) with one UTC offset; a
// zero start or end means unbounded.
type zonePeriod struct {
	offset     int
	start, end int64
	openStart  bool
	openEnd    bool
}

func (p zonePeriod) contains(x int64) bool {
	return (p.openStart || x >= p.start) && (p.openEnd || x < p.end)
}

// periods returns the zone periods covering the instants [from, to].
func periods(loc *time.Location, from, to int64, buf []zonePeriod) []zonePeriod {
	t := time.Unix(from, 0).In(loc)
	for range 64 {
		_, off := t.Zone()
		s, e := t.ZoneBounds()
		p := zonePeriod{offset: off, start: s.Unix(), end: e.Unix(), openStart: s.IsZero(), openEnd: e.IsZero()}
		buf = append(buf, p)
		if p.openEnd || p.end > to {
			break
		}
		t = e.In(loc)
	}
	return buf
}

// offsetRange returns the smallest and largest UTC offsets in force between
// the instants from and to.
func offsetRange(loc *time.Location, from, to int64) (lo, hi int) {
	var arr [8]zonePeriod
	ps := periods(loc, from, to, arr[:0])
	lo, hi = ps[0].offset, ps[0].offset
	for _, p := range ps[1:] {
		lo, hi = min(lo, p.offset), max(hi, p.offset)
	}
	return lo, hi
}

// resolveCivil maps a civil time (Unix seconds of the wall-clock reading
// taken as UTC) to the instant it fires at in loc, following the DST policy
// of cronTrigger.
func resolveCivil(loc *time.Location, civ int64) int64 {
	c := time.Unix(civ, 0).UTC()
	t := time.Date(c.Year(), c.Month(), c.Day(), c.Hour(), c.Minute(), c.Second(), 0, loc)
	s, e := t.ZoneBounds()
	const margin = 30 * 60 * 60 // wider than any offset change
	if (s.IsZero() || t.Unix()-s.Unix() > margin) && (e.IsZero() || e.Unix()-t.Unix() > margin) {
		return t.Unix() // no transition nearby: the civil time exists once
	}
	// Offsets lie in [-12h, +14h], so the instant lies in [civ-14h, civ+12h].
	var arr [8]zonePeriod
	ps := periods(loc, civ-15*60*60, civ+13*60*60, arr[:0])
	first, ok := int64(0), false
	for _, p := range ps {
		if x := civ - int64(p.offset); p.contains(x) && (!ok || x < first) {
			first, ok = x, true
		}
	}
	if ok {
		return first // exists once, or twice and the first occurrence wins
	}
	for i := 0; i+1 < len(ps); i++ {
		before, after := ps[i], ps[i+1]
		if x := civ - int64(before.offset); !before.openEnd && x >= before.end && civ-int64(after.offset) < after.start {
			return x // in the gap: the offset before the transition shifts it forward
		}
	}
	return t.Unix()
}

// locations caches loaded time zones: a *time.Location holds the zone's
// whole transition table, so 100,000 schedules must share a few of them.
var locations sync.Map // name → *time.Location

func loadLocation(name string) (*time.Location, error) {
	if name == "" || name == "UTC" {
		return time.UTC, nil
	}
	if loc, ok := locations.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	actual, _ := locations.LoadOrStore(name, loc)
	return actual.(*time.Location), nil
}
