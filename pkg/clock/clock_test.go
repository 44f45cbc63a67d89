package clock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/jetfleet/jetfleet/pkg/clock"
)

func TestFakeTimersFireWhenTimePasses(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := clock.NewFake(start)
	t1 := c.NewTimer(time.Second)
	t2 := c.NewTimer(3 * time.Second)
	assert.Equal(t, 2, c.Timers())
	c.Advance(2 * time.Second)
	select {
	case at := <-t1.C():
		assert.Equal(t, start.Add(2*time.Second), at)
	default:
		t.Fatal("t1 did not fire")
	}
	select {
	case <-t2.C():
		t.Fatal("t2 fired early")
	default:
	}
	assert.True(t, t2.Stop())
	c.Advance(time.Hour)
	select {
	case <-t2.C():
		t.Fatal("a stopped timer fired")
	default:
	}
	assert.False(t, t1.Reset(time.Minute), "t1 had fired")
	c.Advance(time.Minute)
	<-t1.C()
	c.Set(start) // never backwards
	assert.Equal(t, start.Add(time.Hour+2*time.Second+time.Minute), c.Now())
	_ = c.NewTimer(0)
	assert.Equal(t, 0, c.Timers(), "a zero timer fires at once")
}

func TestRealClock(t *testing.T) {
	t.Parallel()
	c := clock.Real()
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	assert.WithinDuration(t, time.Now(), c.Now(), time.Second)
}

func TestOffsetMovesNowNotTimers(t *testing.T) {
	base := clock.NewFake(time.Date(2026, 6, 1, 10, 0, 0, 0, time.UTC))
	ahead := clock.Offset(base, 30*time.Second)
	if got, want := ahead.Now(), base.Now().Add(30*time.Second); !got.Equal(want) {
		t.Fatalf("Now: got %s, want %s", got, want)
	}
	timer := ahead.NewTimer(time.Second)
	base.Advance(time.Second)
	select {
	case <-timer.C():
	default:
		t.Fatal("a one-second timer of the offset clock did not fire after one second of its base")
	}
}
