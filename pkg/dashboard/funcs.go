package dashboard

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

var funcs = template.FuncMap{
	"dur": fmtDur,
	// plural counts: "1 step", "2 steps".
	"plural": func(n int, noun string) string {
		if n == 1 {
			return "1 " + noun
		}
		return strconv.Itoa(n) + " " + noun + "s"
	},
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		d := now.Sub(t)
		if d < 0 {
			return "in " + fmtDur(-d)
		}
		if d < time.Second {
			return "just now"
		}
		return fmtDur(d) + " ago"
	},
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"iso": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"tsp": func(t *time.Time) string {
		if t == nil || t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"inzone": func(t time.Time, zone string) string {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			loc = time.UTC
		}
		return t.In(loc).Format("Mon 2006-01-02 15:04:05 MST")
	},
	"pct":  func(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) },
	"rate": func(f float64) string { return fmt.Sprintf("%.1f/s", f) },
	"path": url.PathEscape,
	"qs":   func(v url.Values) string { return v.Encode() },
	"setq": func(v url.Values, kv ...string) string {
		c := url.Values{}
		for k, vs := range v {
			c[k] = vs
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" {
				c.Del(kv[i])
			} else {
				c.Set(kv[i], kv[i+1])
			}
		}
		return c.Encode()
	},
	"join":  strings.Join,
	"short": func(s string, n int) string { return shorten(s, n) },
	"str":   func(v any) string { return fmt.Sprint(v) },
	"add":   func(a, b int) int { return a + b },
	"sub":   func(a, b time.Time) time.Duration { return a.Sub(b) },
	"deref": func(t *time.Time) time.Time {
		if t == nil {
			return time.Time{}
		}
		return *t
	},
	"json": func(v any) string {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err.Error()
		}
		return string(b)
	},
	// trace is a trace id worth linking: not empty, not all zeros.
	"trace": func(id string) string {
		if strings.Trim(id, "0") == "" {
			return ""
		}
		return id
	},
	"states": func() []string {
		return []string{"queued", "delayed", "running", "failed", "succeeded", "dead", "cancelled"}
	},
}

func shorten(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// payloadView is a payload decoded for reading: JSON pretty-printed, text
// as is, anything else as hex.
type payloadView struct {
	Kind string // json, text, binary, empty
	Text string
	Size int
}

// maxShownPayload bounds what a page shows of a payload.
const maxShownPayload = 64 << 10

func decodePayload(b []byte) payloadView {
	v := payloadView{Size: len(b)}
	if len(b) == 0 {
		v.Kind = "empty"
		return v
	}
	shown := b
	if len(shown) > maxShownPayload {
		shown = shown[:maxShownPayload]
	}
	var out bytes.Buffer
	if json.Valid(b) && json.Indent(&out, b, "", "  ") == nil {
		v.Kind, v.Text = "json", shorten(out.String(), maxShownPayload)
		return v
	}
	if utf8.Valid(shown) && !bytes.ContainsAny(shown, "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f") {
		v.Kind, v.Text = "text", string(shown)
		return v
	}
	v.Kind, v.Text = "binary", hex.Dump(shown)
	return v
}

func strconvU(v uint64) string { return fmt.Sprint(v) }
