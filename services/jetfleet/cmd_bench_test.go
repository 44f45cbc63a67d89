package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBenchCommand runs one scenario of the smoke as JSON, as a script
// would read it; pkg/bench's TestSmoke covers every scenario.
func TestBenchCommand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	require.NoError(t, run(ctx, []string{"bench", "-smoke", "-scenario", "latency", "-duration", "500ms", "-o", "json", "-q"}, &out))
	var report struct {
		Config struct {
			Runs     int    `json:"runs"`
			Rate     int    `json:"rate"`
			Duration string `json:"duration"`
		} `json:"config"`
		Figures []struct {
			Scenario string    `json:"scenario"`
			Name     string    `json:"name"`
			Values   []float64 `json:"values"`
		} `json:"figures"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &report), out.String())
	assert.Equal(t, 1, report.Config.Runs, "-smoke runs once")
	assert.Equal(t, "0.5s", report.Config.Duration, "a flag given with -smoke overrides the smoke's size, in the JSON duration format")
	names := map[string]bool{}
	for _, f := range report.Figures {
		assert.Equal(t, "latency", f.Scenario)
		assert.Len(t, f.Values, 1)
		names[f.Name] = true
	}
	assert.True(t, names["enqueue_to_start_p99"], "figures: %v", names)
}

func TestBenchCommandErrors(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), []string{"bench", "-scenario", "speed"}, io.Discard)
	assert.ErrorContains(t, err, `unknown scenario "speed"`)
	err = run(context.Background(), []string{"bench", "-o", "xml"}, io.Discard)
	assert.ErrorContains(t, err, "want table or json")
	err = run(context.Background(), []string{"bench", "-runs", "-1"}, io.Discard)
	assert.ErrorContains(t, err, "runs: must be at least 1")
}

func TestSmokeRequested(t *testing.T) {
	t.Parallel()
	assert.True(t, smokeRequested([]string{"-jobs", "10", "-smoke"}))
	assert.True(t, smokeRequested([]string{"--smoke=true", "-v"}))
	assert.False(t, smokeRequested([]string{"-smoke=false"}))
	assert.False(t, smokeRequested([]string{"-scenario", "latency"}))
}

func TestDevBuildNoteNamesABuildWithoutInlining(t *testing.T) {
	build := func(gcflags string) *debug.BuildInfo {
		return &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "-compiler", Value: "gc"}, {Key: "-gcflags", Value: gcflags}}}
	}
	// What go version -m shows for go tool task dev's binary: the last of its -gcflags.
	assert.Contains(t, devBuildNote(build("go.yaml.in/...=-l"), true), "without inlining")
	assert.Contains(t, devBuildNote(build("all=-N -l"), true), "without inlining")
	assert.Empty(t, devBuildNote(build("all=-m"), true))
	assert.Empty(t, devBuildNote(&debug.BuildInfo{}, true), "a default build")
	assert.Empty(t, devBuildNote(nil, false), "no build information")
}
