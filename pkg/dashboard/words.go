package dashboard

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// specWords says when a schedule fires, in words, with its zone.
func specWords(sp *jetfleet.Spec) string {
	zone := sp.Zone
	if zone == "" {
		zone = "UTC"
	}
	switch {
	case sp.Cron != "":
		return cronWords(sp.Cron) + " (" + zone + ")"
	case sp.Interval != nil:
		s := "every " + fmtDur(time.Duration(sp.Interval.Every))
		if sp.Interval.Phase > 0 {
			s += ", offset by " + fmtDur(time.Duration(sp.Interval.Phase))
		}
		return s
	case sp.At != nil:
		return "once, at " + sp.At.UTC().Format("2006-01-02 15:04:05") + " UTC"
	case sp.Event != nil:
		return "on every message on " + sp.Event.Subject
	case sp.After != nil:
		var ups []string
		for _, u := range sp.After.On {
			switch {
			case u.ScheduleID != "":
				ups = append(ups, "schedule "+u.ScheduleID)
			case u.Queue != "":
				ups = append(ups, "kind "+u.Kind+" on "+u.Queue)
			default:
				ups = append(ups, "kind "+u.Kind)
			}
		}
		if len(ups) == 1 {
			return "after each success of " + ups[0]
		}
		return "when " + strings.Join(ups, " and ") + " have all succeeded for the same time"
	}
	return "never"
}

var weekdays = []string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"}

// cronWords reads the common shapes of a cron spec; anything else is shown
// as the spec itself.
func cronWords(spec string) string {
	switch spec {
	case "@yearly", "@annually":
		return "every year, on January 1 at 00:00"
	case "@monthly":
		return "every month, on the 1st at 00:00"
	case "@weekly":
		return "every week, on Sunday at 00:00"
	case "@daily", "@midnight":
		return "every day at 00:00"
	case "@hourly":
		return "every hour, on the hour"
	}
	if d, ok := strings.CutPrefix(spec, "@every "); ok {
		return "every " + d
	}
	f := strings.Fields(spec)
	sec := "0"
	if len(f) == 6 {
		sec, f = f[0], f[1:]
	}
	if len(f) != 5 {
		return "cron " + spec
	}
	minute, hour, dom, month, dow := f[0], f[1], f[2], f[3], f[4]
	num := func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil
	}
	every := func(s string) (int, bool) {
		if v, ok := strings.CutPrefix(s, "*/"); ok {
			return num(v)
		}
		return 0, false
	}
	if month != "*" {
		return "cron " + spec
	}
	if n, ok := every(sec); ok && minute == "*" && hour == "*" && dom == "*" && dow == "*" {
		return fmt.Sprintf("every %d seconds", n)
	}
	s, sok := num(sec)
	if !sok {
		return "cron " + spec
	}
	if n, ok := every(minute); ok && hour == "*" && dom == "*" && dow == "*" && s == 0 {
		return fmt.Sprintf("every %d minutes", n)
	}
	if minute == "*" && hour == "*" && dom == "*" && dow == "*" {
		if s == 0 {
			return "every minute"
		}
		return fmt.Sprintf("every minute, at second %d", s)
	}
	m, mok := num(minute)
	if !mok {
		return "cron " + spec
	}
	if hour == "*" && dom == "*" && dow == "*" {
		if m == 0 && s == 0 {
			return "every hour, on the hour"
		}
		return fmt.Sprintf("every hour at minute %d", m)
	}
	h, hok := num(hour)
	if n, ok := every(hour); ok && dom == "*" && dow == "*" {
		return fmt.Sprintf("every %d hours at minute %d", n, m)
	}
	if !hok {
		return "cron " + spec
	}
	at := fmt.Sprintf("%02d:%02d", h, m)
	if s != 0 {
		at += fmt.Sprintf(":%02d", s)
	}
	switch {
	case dom == "*" && dow == "*":
		return "every day at " + at
	case dom == "*" && dow == "1-5":
		return "every weekday at " + at
	case dom == "*":
		if d, ok := num(dow); ok && d >= 0 && d <= 7 {
			return "every " + weekdays[d] + " at " + at
		}
	case dow == "*":
		if d, ok := num(dom); ok {
			return fmt.Sprintf("on day %d of every month at %s", d, at)
		}
	}
	return "cron " + spec
}

// fmtDur writes a duration short and readable: 850µs, 12ms, 1.5s, 2m30s, 3h.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < 10*time.Millisecond:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)), ".0") + "ms"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", d.Seconds()), ".0") + "s"
	case d < time.Hour:
		return (d.Round(time.Second)).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix((d.Round(time.Minute)).String(), "0s")
	}
	return fmt.Sprintf("%.0fd", d.Hours()/24)
}
