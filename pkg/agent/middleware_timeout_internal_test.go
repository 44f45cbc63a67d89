package agent

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The deadline context must behave as context.WithDeadline does, though it
// arms its timer only when Done is first called.

func TestDeadlineContextEndsAtItsDeadlineOnceWaitedOn(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(50 * time.Millisecond)
	dc := newDeadlineContext(context.Background(), deadline)
	d, ok := dc.Deadline()
	require.True(t, ok)
	assert.Equal(t, deadline, d)
	assert.NoError(t, dc.Err())
	<-dc.Done()
	assert.False(t, time.Now().Before(deadline), "ended before its deadline")
	assert.Equal(t, context.DeadlineExceeded, dc.Err())
	assert.Equal(t, context.DeadlineExceeded, context.Cause(dc))
}

func TestDeadlineContextNeverWaitedOnReadsTheClock(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(20 * time.Millisecond)
	dc := newDeadlineContext(context.Background(), deadline)
	// No Done: no timer. Err still reports the passed deadline, and from
	// then on Done is closed, as the context contract asks.
	stdlib, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	<-stdlib.Done()
	assert.Equal(t, context.DeadlineExceeded, dc.Err())
	select {
	case <-dc.Done():
	default:
		t.Fatal("Err reports an end but Done is open")
	}
	assert.Equal(t, context.DeadlineExceeded, context.Cause(dc))
}

func TestDeadlineContextFollowsItsParentWithItsCause(t *testing.T) {
	t.Parallel()
	cause := errors.New("cancelled by command")
	for _, waited := range []bool{true, false} {
		parent, cancel := context.WithCancelCause(context.Background())
		dc := newDeadlineContext(parent, time.Now().Add(time.Hour))
		if waited {
			_ = dc.Done()
		}
		cancel(cause)
		if waited {
			<-dc.Done()
		}
		assert.Equal(t, context.Canceled, dc.Err(), "waited %t", waited)
		assert.Equal(t, cause, context.Cause(dc), "waited %t", waited)
		<-dc.Done()
	}
}

func TestDeadlineContextTakesTheEarlierDeadline(t *testing.T) {
	t.Parallel()
	early := time.Now().Add(time.Minute)
	parent, cancel := context.WithDeadline(context.Background(), early)
	defer cancel()
	d, _ := newDeadlineContext(parent, early.Add(time.Hour)).Deadline()
	assert.Equal(t, early, d)
	d, _ = newDeadlineContext(parent, early.Add(-time.Second)).Deadline()
	assert.Equal(t, early.Add(-time.Second), d)
}

func TestDeadlineContextEndedByItsOwnerIsCancelledAndDisarmed(t *testing.T) {
	t.Parallel()
	parent, cancelParent := context.WithCancelCause(context.Background())
	defer cancelParent(nil)
	dc := newDeadlineContext(parent, time.Now().Add(time.Hour))
	_ = dc.Done()
	dc.end(context.Canceled)
	<-dc.Done()
	assert.Equal(t, context.Canceled, dc.Err())
	dc.mu.Lock()
	timer := dc.timer
	dc.mu.Unlock()
	require.NotNil(t, timer)
	assert.False(t, timer.Stop(), "the timer of an ended context still runs")
	// Nor does the parent's end change how it ended (context.Cause does
	// read the parent's later cause: see deadlineContext).
	cancelParent(errors.New("later"))
	assert.Equal(t, context.Canceled, dc.Err())
	// Never waited on: ending costs no timer.
	quiet := newDeadlineContext(parent, time.Now().Add(time.Hour))
	quiet.end(context.Canceled)
	assert.Nil(t, quiet.timer)
	<-quiet.Done()
}

func TestDeadlineContextChildrenAndAfterFuncsEndWithIt(t *testing.T) {
	t.Parallel()
	dc := newDeadlineContext(context.Background(), time.Now().Add(30*time.Millisecond))
	child, cancelChild := context.WithCancel(dc)
	defer cancelChild()
	var called sync.WaitGroup
	called.Add(1)
	context.AfterFunc(dc, called.Done)
	stopped := context.AfterFunc(dc, func() { t.Error("a stopped AfterFunc ran") })
	assert.True(t, stopped())
	<-child.Done()
	assert.Equal(t, context.DeadlineExceeded, child.Err())
	assert.Equal(t, context.DeadlineExceeded, context.Cause(child))
	called.Wait()
	// Registered after the end: runs at once.
	called.Add(1)
	assert.False(t, context.AfterFunc(dc, called.Done)())
	called.Wait()
}

func TestDeadlineContextIsSafeForConcurrentUse(t *testing.T) {
	t.Parallel()
	for range 200 {
		dc := newDeadlineContext(context.Background(), time.Now().Add(time.Microsecond))
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				<-dc.Done()
				assert.Error(t, dc.Err())
			})
		}
		wg.Go(func() { dc.end(context.Canceled) })
		wg.Wait()
	}
}

// BenchmarkTimeoutContext compares the deadline context with
// context.WithDeadline for a job that never waits on its context.
func BenchmarkTimeoutContext(b *testing.B) {
	parent, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	deadline := time.Now().Add(time.Hour)
	b.Run("context.WithDeadline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, stop := context.WithDeadline(parent, deadline)
			_ = ctx
			stop()
		}
	})
	b.Run("deadlineContext", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			dc := newDeadlineContext(parent, deadline)
			dc.end(context.Canceled)
		}
	})
}
