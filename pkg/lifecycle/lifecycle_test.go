package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/jetfleet/jetfleet/pkg/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, s)
}

type fake struct {
	name     string
	rec      *recorder
	startErr error
}

func (f *fake) Name() string { return f.name }
func (f *fake) Start(context.Context) error {
	f.rec.add("start " + f.name)
	return f.startErr
}
func (f *fake) Stop(context.Context) error {
	f.rec.add("stop " + f.name)
	return nil
}

func TestGroupStartsInOrderAndStopsInReverse(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	g := lifecycle.NewGroup("g", &fake{name: "a", rec: rec}, &fake{name: "b", rec: rec}, &fake{name: "c", rec: rec})
	require.NoError(t, g.Start(context.Background()))
	require.NoError(t, g.Stop(context.Background()))
	require.NoError(t, g.Stop(context.Background()), "second stop is a no-op")
	assert.Equal(t, []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}, rec.log)
}

func TestGroupRollsBackOnStartFailure(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	boom := errors.New("boom")
	g := lifecycle.NewGroup("g", &fake{name: "a", rec: rec}, &fake{name: "b", rec: rec, startErr: boom}, &fake{name: "c", rec: rec})
	err := g.Start(context.Background())
	require.ErrorIs(t, err, boom)
	assert.ErrorContains(t, err, "start b")
	assert.Equal(t, []string{"start a", "start b", "stop a"}, rec.log)
}

type looper struct {
	lifecycle.Runner
	ticks   chan struct{}
	release chan struct{} // when set, the goroutine ignores its stop signal until released
}

func (l *looper) Start(ctx context.Context) error {
	runCtx, err := l.Begin(ctx)
	if err != nil {
		return err
	}
	_ = runCtx
	l.Go(func(ctx context.Context) {
		for {
			select {
			case <-ctx.Done():
				if l.release != nil {
					<-l.release
				}
				return
			case l.ticks <- struct{}{}:
			}
		}
	})
	return nil
}

func TestRunnerStopWaitsForGoroutines(t *testing.T) {
	t.Parallel()
	l := &looper{ticks: make(chan struct{})}
	require.NoError(t, l.Stop(context.Background()), "stop before start is a no-op")
	require.NoError(t, l.Start(context.Background()))
	require.ErrorIs(t, l.Start(context.Background()), lifecycle.ErrAlreadyStarted)
	<-l.ticks
	require.NoError(t, l.Stop(context.Background()))
	select {
	case <-l.Done():
	default:
		t.Fatal("Done not closed after Stop returned")
	}
	require.NoError(t, l.Stop(context.Background()), "stop twice")
}

func TestRunnerStopIsBoundedByContext(t *testing.T) {
	t.Parallel()
	l := &looper{ticks: make(chan struct{}), release: make(chan struct{})}
	require.NoError(t, l.Start(context.Background()))
	<-l.ticks
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, l.Stop(ctx), context.DeadlineExceeded)
	close(l.release)
	require.NoError(t, l.Stop(context.Background()), "a later stop waits for the released goroutine")
}

func TestRunStopsOnContextEnd(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- lifecycle.Run(ctx, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Second, &fake{name: "a", rec: rec})
	}()
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, []string{"start a", "stop a"}, rec.log)
}
