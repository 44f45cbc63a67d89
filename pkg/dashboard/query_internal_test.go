package dashboard

import (
	"errors"
	"net/url"
	"testing"
	"time"
)

// FuzzParseFilter: no query string makes the filter parser panic, and
// whatever it accepts it writes back to a query it accepts again.
func FuzzParseFilter(f *testing.F) {
	for _, seed := range []string{
		"state=dead&queue=default&kind=echo&since=1h&until=2026-11-25T10:00:00Z&limit=20",
		"q=night&paused=yes&after=a-b_c",
		"job=%F0%9F%92%A5&reason=max_attempts&cursor=18446744073709551615",
		"since=-1h", "limit=99999", "state=&state=dead", "since=2026-13-40", "queue=a.b", "%zz", "since=9999999h",
	} {
		f.Add(seed)
	}
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	all := []string{"state", "queue", "kind", "reason", "job", "schedule", "agent", "q", "paused", "since", "until", "cursor", "after", "limit"}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		fl, err := parseFilter(q, now, 1000, all...)
		if err != nil {
			var qe *queryError
			if !errors.As(err, &qe) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		again, err := parseFilter(fl.values(), now, 1000, all...)
		if err != nil {
			t.Fatalf("the filter %+v written back is refused: %v", fl, err)
		}
		if again.State != fl.State || again.Queue != fl.Queue || again.JobID != fl.JobID || !again.Since.Equal(fl.Since.Truncate(time.Second)) {
			t.Fatalf("round trip changed the filter: %+v → %+v", fl, again)
		}
	})
}

func TestCronWords(t *testing.T) {
	for spec, want := range map[string]string{
		"30 2 * * *": "every day at 02:30", "*/5 * * * *": "every 5 minutes", "0 * * * *": "every hour, on the hour", "5 * * * *": "every hour at minute 5",
		"0 9 * * 1-5": "every weekday at 09:00", "0 9 * * 1": "every Monday at 09:00", "*/10 * * * * *": "every 10 seconds",
		"@daily": "every day at 00:00", "@every 90s": "every 90s", "0 0 1 1 *": "cron 0 0 1 1 *", "15 3 1 * *": "on day 1 of every month at 03:15",
	} {
		if got := cronWords(spec); got != want {
			t.Errorf("cronWords(%q) = %q, want %q", spec, got, want)
		}
	}
}
