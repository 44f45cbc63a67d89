package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func completionScript(t *testing.T, shell string) string {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"completion", shell}, &out))
	return out.String()
}

// checkSyntax runs shell -n on the script.
func checkSyntax(t *testing.T, shell, script string) {
	t.Helper()
	path, err := exec.LookPath(shell)
	if err != nil {
		t.Fatalf("%s is not installed (Debian: apt-get install %s; .ci/run installs it): %v", shell, shell, err)
	}
	file := filepath.Join(t.TempDir(), "jetfleet."+shell)
	require.NoError(t, os.WriteFile(file, []byte(script), 0o600))
	out, err := exec.Command(path, "-n", file).CombinedOutput()
	require.NoError(t, err, "%s -n: %s", shell, out)
}

func TestCompletionMentionsEveryCommandAndFlag(t *testing.T) {
	t.Parallel()
	for _, shell := range shells {
		script := completionScript(t, shell)
		for _, path := range everyCommand() {
			assert.Contains(t, script, path[len(path)-1], "%s: %v", shell, path)
		}
		for _, l := range leaves() {
			assert.Contains(t, script, l.path, shell)
			for _, f := range l.flags {
				assert.Contains(t, script, "-"+f.Name, "%s: %s", shell, l.path)
			}
		}
	}
}

func TestBashCompletion(t *testing.T) {
	t.Parallel()
	script := completionScript(t, "bash")
	checkSyntax(t, "bash", script)
	// Complete a few command lines with the script, as bash would.
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"jetfleet", "sch"}, "schedule"},
		{[]string{"jetfleet", "dlq", ""}, "ls show replay purge"},
		{[]string{"jetfleet", "dlq", "ls", "-qu"}, "-queue"},
		{[]string{"jetfleet", "status", "-o", ""}, "table json"},
		{[]string{"jetfleet", "schedule", "add", "-overlap", "b"}, "buffer_one"},
		{[]string{"jetfleet", "completion", ""}, "bash zsh"},
		{[]string{"jetfleet", "help", "que"}, "queue"},
		{[]string{"jetfleet", "help", "jobs", "h"}, "history"},
		{[]string{"jetfleet", "submit", "-pass"}, "-password"},
		{[]string{"jetfleet", "workflow", "r"}, "rm run runs retry-failed"},
		{[]string{"jetfleet", "workflow", "runs", "-status", "c"}, "cancelled"},
		{[]string{"jetfleet", "workflow", "run", "-w"}, "-wait -wait-timeout"},
	} {
		words := make([]string, len(tc.words))
		for i, w := range tc.words {
			words[i] = "'" + w + "'"
		}
		prog := script + "\nCOMP_WORDS=(" + strings.Join(words, " ") + ")\nCOMP_CWORD=" + strconv.Itoa(len(tc.words)-1) +
			"\n_jetfleet\necho \"${COMPREPLY[*]}\"\n"
		out, err := exec.Command("bash", "-c", prog).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Equal(t, tc.want, strings.TrimSpace(string(out)), "%q", tc.words)
	}
}

func TestZshCompletion(t *testing.T) {
	t.Parallel()
	script := completionScript(t, "zsh")
	assert.True(t, strings.HasPrefix(script, "#compdef jetfleet\n"))
	checkSyntax(t, "zsh", script)
}
