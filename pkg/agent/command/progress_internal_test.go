package command

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

type progressReport struct {
	fraction float64
	message  string
}

// TestProgressLines: progress lines are reported and left out of the
// output, whatever the writes' boundaries; every other byte passes on.
func TestProgressLines(t *testing.T) {
	t.Parallel()
	long := "::progress 0.5 " + strings.Repeat("x", maxProgressLine) + "\n"
	input := "starting\n" +
		"::progress 0.5 half way\n" +
		"::progress 1\r\n" +
		"::progress x not a number\n" +
		"::progress 1.5 too far\n" +
		"  ::progress 0.1 not at the start\n" +
		"::prog\n" +
		"::progresss 0.2 another word\n" + //nolint:misspell // a near miss of ::progress on purpose
		long +
		"\n" +
		"::progress 0.9 last, without a newline"
	wantOut := "starting\n" +
		"::progress x not a number\n" +
		"::progress 1.5 too far\n" +
		"  ::progress 0.1 not at the start\n" +
		"::prog\n" +
		"::progresss 0.2 another word\n" + //nolint:misspell // a near miss of ::progress on purpose
		long +
		"\n"
	wantReports := []progressReport{{0.5, "half way"}, {1, ""}, {0.9, "last, without a newline"}}
	for _, size := range []int{1, 2, 3, 7, 11, 64, len(input)} {
		var out bytes.Buffer
		var reports []progressReport
		w := &progressLines{out: &out, report: func(f float64, m string) { reports = append(reports, progressReport{f, m}) }}
		for rest := input; rest != ""; {
			n := min(size, len(rest))
			k, err := w.Write([]byte(rest[:n]))
			assert.NoError(t, err)
			assert.Equal(t, n, k)
			rest = rest[n:]
		}
		w.flush()
		assert.Equal(t, wantOut, out.String(), "writes of %d bytes", size)
		assert.Equal(t, wantReports, reports, "writes of %d bytes", size)
	}
}
