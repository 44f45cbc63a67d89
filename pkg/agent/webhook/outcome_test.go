package webhook

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/jetfleet/jetfleet/pkg/agent"
)

func TestStatusMapsToOutcome(t *testing.T) {
	t.Parallel()
	h, err := New(Config{URL: "http://127.0.0.1:1/x", MaxRetryAfter: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		status     int
		retryAfter string
		want       string // ok, retry, retry-after, fail
		delay      time.Duration
	}{
		{200, "", "ok", 0}, {201, "", "ok", 0}, {204, "", "ok", 0},
		{302, "", "fail", 0}, {400, "", "fail", 0}, {401, "", "fail", 0}, {404, "", "fail", 0}, {422, "", "fail", 0},
		{408, "", "retry", 0}, {429, "", "retry", 0}, {500, "", "retry", 0}, {502, "", "retry", 0},
		{429, "7", "retry-after", 7 * time.Second},
		{503, "Tue, 01 Jan 2030 00:00:30 GMT", "retry-after", 30 * time.Second},
		{503, "Mon, 31 Dec 2029 23:00:00 GMT", "retry-after", 0}, // in the past: at once
		{503, "3600", "retry-after", time.Minute},                // capped by max_retry_after
		{503, "soon", "retry", 0},                                // unreadable: the policy's backoff
		{400, "5", "fail", 0},                                    // Retry-After does not make a 4xx retryable
	}
	for _, c := range cases {
		resp := &http.Response{StatusCode: c.status, Status: http.StatusText(c.status), Header: http.Header{}}
		if c.retryAfter != "" {
			resp.Header.Set("Retry-After", c.retryAfter)
		}
		err := h.outcome(resp, now)
		var nonRet *agent.NonRetryableError
		var retry *agent.RetryError
		switch c.want {
		case "ok":
			assert.NoError(t, err, c.status)
		case "fail":
			assert.True(t, errors.As(err, &nonRet), "%d: %v", c.status, err)
		case "retry":
			assert.Error(t, err)
			assert.False(t, errors.As(err, &nonRet) || errors.As(err, &retry), "%d %s: plain retryable error, got %T", c.status, c.retryAfter, err)
		case "retry-after":
			if assert.True(t, errors.As(err, &retry), "%d %s: %v", c.status, c.retryAfter, err) {
				assert.Equal(t, c.delay, retry.Delay, "%d %s", c.status, c.retryAfter)
			}
		}
		var se *StatusError
		if err != nil {
			assert.True(t, errors.As(err, &se) && se.StatusCode == c.status, "%d: a *StatusError", c.status)
		}
	}
}
