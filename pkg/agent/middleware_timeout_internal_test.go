package agent

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
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

func TestDeadlineContextPassedDeadlineWinsOverAParentEndNoticedLater(t *testing.T) {
	t.Parallel()
	parent, cancel := context.WithCancelCause(context.Background())
	deadline := time.Now().Add(10 * time.Millisecond)
	dc := newDeadlineContext(parent, deadline)
	waitUntil(deadline)
	cancel(errors.New("timeout command"))
	assert.Equal(t, context.DeadlineExceeded, dc.Err())
}

// TestTimeoutReportsAHandlerThatIgnoredItsContext runs the middleware with
// handlers that never ask for Done: a deadline passed is still reported
// as a *TimeoutError, and a job context cancelled before it is not.
func TestTimeoutReportsAHandlerThatIgnoredItsContext(t *testing.T) {
	t.Parallel()
	late := errors.New("late")
	run := func(ctx context.Context, deadline time.Time, handler Handler) error {
		return Timeout()(handler)(ctx, &Job{Deadline: deadline})
	}

	deadline := time.Now().Add(10 * time.Millisecond)
	err := run(context.Background(), deadline, func(context.Context, *Job) error { waitUntil(deadline); return late })
	var te *TimeoutError
	assert.ErrorAs(t, err, &te, "returned after its deadline")

	parent, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("cancel command"))
	err = run(parent, time.Now().Add(time.Hour), func(context.Context, *Job) error { return late })
	assert.Equal(t, late, err, "cancelled before its deadline")

	parent, cancel = context.WithCancelCause(context.Background())
	deadline = time.Now().Add(10 * time.Millisecond)
	err = run(parent, deadline, func(context.Context, *Job) error {
		waitUntil(deadline)
		cancel(errors.New("timeout command"))
		return late
	})
	assert.ErrorAs(t, err, &te, "deadline passed, then the job context cancelled")
}

// waitUntil returns once t has passed, on a timer of the standard library.
func waitUntil(t time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), t)
	defer cancel()
	<-ctx.Done()
}

// countingParent is a cancellable parent that counts the AfterFunc
// registrations it holds. It hides its cancelCtx from Value, so the
// standard library joins it through AfterFunc, as a custom parent.
type countingParent struct {
	context.Context
	cancel context.CancelFunc
	live   atomic.Int64
}

func newCountingParent() *countingParent {
	ctx, cancel := context.WithCancel(context.Background())
	return &countingParent{Context: ctx, cancel: cancel}
}

func (p *countingParent) Value(key any) any {
	if _, ok := key.(*int); ok { // the context package's cancelCtxKey
		return nil
	}
	return p.Context.Value(key)
}

func (p *countingParent) AfterFunc(f func()) func() bool {
	p.live.Add(1)
	var once sync.Once
	release := func() { once.Do(func() { p.live.Add(-1) }) }
	stop := context.AfterFunc(p.Context, func() { release(); f() })
	return func() bool {
		stopped := stop()
		if stopped {
			release()
		}
		return stopped
	}
}

// TestDeadlineContextLeavesNoRegistrationInItsParent races Done, Err, the
// owner's end and the deadline: once ended, the context holds nothing in
// its parent (a timer or a registration left would keep it alive).
func TestDeadlineContextLeavesNoRegistrationInItsParent(t *testing.T) {
	t.Parallel()
	for i := range 2000 {
		p := newCountingParent()
		deadline := time.Now().Add(time.Duration(i%3) * time.Microsecond)
		if i%5 == 0 {
			deadline = time.Now().Add(time.Hour)
		}
		dc := newDeadlineContext(p, deadline)
		var wg sync.WaitGroup
		wg.Go(func() { <-dc.Done() })
		wg.Go(func() { dc.Done() })
		wg.Go(func() { _ = dc.Err() })
		wg.Go(func() { runtime.Gosched(); dc.end(context.Canceled) })
		wg.Wait()
		// A timer that fired ends the context on a goroutine of its own,
		// which nothing here can wait on: that end may still be under way.
		require.Eventually(t, func() bool { return p.live.Load() == 0 }, time.Second, 50*time.Microsecond,
			"run %d: registrations left in the parent", i)
		dc.mu.Lock()
		timer := dc.timer
		dc.mu.Unlock()
		if timer != nil {
			require.False(t, timer.Stop(), "run %d: the timer of an ended context still runs", i)
		}
		p.cancel()
	}
}

// TestDeadlineContextKeepsItsContractUnderConcurrentUse races readers,
// AfterFuncs (some stopped), children (some cancelled), the parent's end,
// the owner's end and the deadline. Err never reports an end while Done is
// open and never changes; every AfterFunc either runs or is stopped,
// exactly once; nothing stays registered.
func TestDeadlineContextKeepsItsContractUnderConcurrentUse(t *testing.T) {
	t.Parallel()
	for i := range 1000 {
		parent, cancel := context.WithCancelCause(context.Background())
		dc := newDeadlineContext(parent, time.Now().Add(time.Duration(i%50)*time.Microsecond))
		var wg, afterFuncs sync.WaitGroup
		for range 3 {
			wg.Go(func() {
				for {
					err := dc.Err()
					if err == nil {
						runtime.Gosched()
						continue
					}
					select {
					case <-dc.Done():
					default:
						t.Errorf("Err is %v while Done is open", err)
					}
					assert.Equal(t, err, dc.Err(), "Err changed")
					return
				}
			})
			afterFuncs.Add(1)
			wg.Go(func() {
				stop := context.AfterFunc(dc, afterFuncs.Done) // Done twice would panic
				if i%2 == 0 && stop() {
					afterFuncs.Done()
				}
			})
			wg.Go(func() {
				child, cancelChild := context.WithCancel(dc)
				if i%3 == 0 {
					cancelChild()
				}
				<-child.Done()
				cancelChild()
			})
		}
		if i%4 == 0 {
			wg.Go(func() { cancel(errors.New("cause")) })
		}
		if i%7 == 0 {
			wg.Go(func() { dc.end(context.Canceled) })
		}
		wg.Wait()
		waited := make(chan struct{})
		go func() { afterFuncs.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d: an AfterFunc neither ran nor was stopped", i)
		}
		dc.end(context.Canceled)
		dc.mu.Lock()
		assert.Empty(t, dc.afterFuncs, "run %d", i)
		dc.mu.Unlock()
		cancel(nil)
	}
}

func TestDeadlineContextForgetsCancelledChildren(t *testing.T) {
	t.Parallel()
	dc := newDeadlineContext(context.Background(), time.Now().Add(time.Hour))
	defer dc.end(context.Canceled)
	for range 100 {
		_, cancelChild := context.WithCancel(dc)
		cancelChild()
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	assert.Empty(t, dc.afterFuncs)
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
