package jetfleet_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEGoCodeIsTheExample: the Go code the README shows is the
// package example's, line for line, so it compiles and runs in the tests.
func TestREADMEGoCodeIsTheExample(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	example, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	require.NotEmpty(t, blocks, "the README has a Go block")
	for _, block := range blocks {
		for _, line := range strings.Split(block[1], "\n") {
			if strings.TrimSpace(line) == "" {
				continue
			}
			require.Contains(t, string(example), line, "a README line that example_test.go does not have")
		}
	}
}
