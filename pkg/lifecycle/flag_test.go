package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/lifecycle"
)

func TestFlagWaitReturnsOnTheAwaitedState(t *testing.T) {
	var f lifecycle.Flag
	require.NoError(t, f.Wait(context.Background(), false), "a new flag is off")

	woke := make(chan error, 1)
	go func() { woke <- f.Wait(context.Background(), true) }()
	f.Set(true)
	select {
	case err := <-woke:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Wait(true) did not return after Set(true)")
	}
	assert.True(t, f.Get())

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, f.Wait(ctx, false), context.Canceled, "Wait(false) on an on flag waits until ctx ends")
}
