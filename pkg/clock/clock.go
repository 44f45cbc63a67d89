// Package clock is the injectable time source of jetfleet's scheduling and
// supervision logic: Real in production, Fake in tests that move time by hand.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the loops use.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Real is the system clock.
func Real() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer {
	return &realTimer{t: time.NewTimer(d)}
}

type realTimer struct{ t *time.Timer }

// Offset is c moved by d: Now is c.Now()+d; timers run as c's. It stands
// for a machine whose clock is wrong (the clock-skew fault scenario).
func Offset(c Clock, d time.Duration) Clock { return offsetClock{c: c, d: d} }

type offsetClock struct {
	c Clock
	d time.Duration
}

func (o offsetClock) Now() time.Time                 { return o.c.Now().Add(o.d) }
func (o offsetClock) NewTimer(d time.Duration) Timer { return o.c.NewTimer(d) }

func (r *realTimer) C() <-chan time.Time        { return r.t.C }
func (r *realTimer) Stop() bool                 { return r.t.Stop() }
func (r *realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

// Fake is a clock that only moves when told to. Timers fire (in deadline
// order) when Advance or Set moves the time past their deadline.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

// NewFake returns a fake clock showing now.
func NewFake(now time.Time) *Fake { return &Fake{now: now} }

// Now implements Clock.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer implements Clock.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{clock: f, c: make(chan time.Time, 1), deadline: f.now.Add(d), active: true}
	f.timers = append(f.timers, t)
	f.fireLocked()
	return t
}

// Advance moves the clock forward by d.
func (f *Fake) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

// Set moves the clock to t (never backwards).
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.After(f.now) {
		f.now = t
	}
	f.fireLocked()
}

// Timers is the number of active timers, for tests that wait until a loop
// has armed its timer.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, t := range f.timers {
		if t.active {
			n++
		}
	}
	return n
}

func (f *Fake) fireLocked() {
	sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].deadline.Before(f.timers[j].deadline) })
	kept := f.timers[:0]
	for _, t := range f.timers {
		if t.active && !t.deadline.After(f.now) {
			t.active = false
			select {
			case t.c <- f.now:
			default:
			}
			continue
		}
		if t.active {
			kept = append(kept, t)
		}
	}
	f.timers = kept
}

type fakeTimer struct {
	clock    *Fake
	c        chan time.Time
	deadline time.Time
	active   bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.clock
	f.mu.Lock()
	defer f.mu.Unlock()
	was := t.active
	t.deadline = f.now.Add(d)
	if !t.active {
		t.active = true
		f.timers = append(f.timers, t)
	}
	f.fireLocked()
	return was
}
