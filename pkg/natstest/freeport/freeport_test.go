package freeport

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPickHandsOutDistinctBindablePortsBelowTheEphemeralRange(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		port, err := Pick()
		require.NoError(t, err)
		require.False(t, seen[port], "port %d handed out twice", port)
		seen[port] = true
		require.GreaterOrEqual(t, port, lowest)
		require.Less(t, port, ephemeralLow())
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		require.NoError(t, err, "port %d", port)
		require.NoError(t, l.Close())
	}
}

func TestPickSkipsAPortSomeoneListensOn(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = held.Close() }()
	busy := held.Addr().(*net.TCPAddr).Port
	free, err := Pick()
	require.NoError(t, err)
	mu.Lock()
	delete(issued, free) // as if another process had handed it out
	mu.Unlock()

	candidates := []int{busy, free}
	port, err := pickFrom(func() int { p := candidates[0]; candidates = candidates[1:]; return p })
	require.NoError(t, err)
	require.Equal(t, free, port, "the port someone listens on is skipped")

	_, err = pickFrom(func() int { return busy })
	require.ErrorContains(t, err, "address already in use")
}
