package dashboard

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// live streams server-sent events to a browser: one "refresh" event
// (data: the topic) whenever something a page shows changed, at most one
// per live_interval. The page's script then fetches its main part again;
// without JavaScript the page is complete as it is.
func (d *Dashboard) live(w http.ResponseWriter, r *http.Request) {
	var topics []string
	for _, t := range strings.Split(r.URL.Query().Get("topics"), ",") {
		t = strings.TrimSpace(t)
		if t != "" && len(t) <= 300 && len(topics) < 16 {
			topics = append(topics, t)
		}
	}
	if len(topics) == 0 {
		http.Error(w, "topics: give the topics to follow, comma-separated", http.StatusBadRequest)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	c, unsubscribe, err := d.hub.subscribe(topics)
	if err != nil {
		http.Error(w, "too many live pages open; reload later", http.StatusServiceUnavailable)
		return
	}
	defer unsubscribe()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, "retry: 2000\nevent: hello\ndata: %s\n\n", strings.Join(topics, ","))
	flusher.Flush()
	keepAlive := time.NewTicker(25 * time.Second)
	defer keepAlive.Stop()
	var last time.Time
	for {
		select {
		case <-r.Context().Done():
			return
		case <-d.closing:
			return
		case <-keepAlive.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case topic := <-c.notify:
			if wait := d.cfg.LiveInterval - time.Since(last); wait > 0 {
				select {
				case <-time.After(wait):
				case <-r.Context().Done():
					return
				case <-d.closing:
					return
				}
			}
			last = time.Now()
			fmt.Fprintf(w, "event: refresh\ndata: %s\n\n", topic)
		}
		flusher.Flush()
	}
}
