package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// execution is one record of the recorder: one run of kind effect.
type execution struct {
	jobID   string
	attempt int
	// scheduleID and nominal (Unix seconds) are set for scheduled jobs.
	scheduleID string
	nominal    int64
	at         time.Time
}

// recorder is the harness's witness of effects: the agents' http handler
// POSTs every execution of kind effect to it. It listens on the Docker
// bridge's address of this host, which containers reach as
// host.docker.internal (compose.chaos.yml), and nowhere else.
type recorder struct {
	srv *http.Server
	url string

	mu    sync.Mutex
	byJob map[string][]execution
	all   []execution
}

func startRecorder() (*recorder, error) {
	host, err := bridgeAddress()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("recorder: %w", err)
	}
	r := &recorder{byJob: map[string][]execution{}}
	r.url = fmt.Sprintf("http://host.docker.internal:%d/effect", ln.Addr().(*net.TCPAddr).Port)
	r.srv = &http.Server{Handler: http.HandlerFunc(r.record), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

// bridgeAddress is the IPv4 address of docker0, where host-gateway points.
func bridgeAddress() (string, error) {
	if iface, err := net.InterfaceByName("docker0"); err == nil {
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				return ipn.IP.String(), nil
			}
		}
	}
	out, err := exec.Command("docker", "network", "inspect", "bridge", "--format", "{{range .IPAM.Config}}{{.Gateway}} {{end}}").Output()
	if gw := strings.Fields(string(out)); err == nil && len(gw) > 0 {
		return gw[0], nil
	}
	return "", errors.New("recorder: no docker0 interface and no gateway of Docker's bridge network: is Docker running here?")
}

func (r *recorder) record(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/effect" {
		http.Error(w, "POST /effect only", http.StatusNotFound)
		return
	}
	x := execution{jobID: req.Header.Get(protocol.HeaderJobID), scheduleID: req.Header.Get(protocol.HeaderScheduleID), at: time.Now()}
	var err error
	if x.attempt, err = strconv.Atoi(req.Header.Get("Jetfleet-Attempt")); err != nil || x.jobID == "" {
		http.Error(w, "no Jetfleet-Job-Id or Jetfleet-Attempt", http.StatusBadRequest) // a defect of the agent: counted as lost
		return
	}
	if x.scheduleID != "" {
		t, err := time.Parse(time.RFC3339Nano, req.Header.Get(protocol.HeaderNominalTime))
		if err != nil {
			http.Error(w, "bad Jetfleet-Nominal-Time", http.StatusBadRequest)
			return
		}
		x.nominal = t.Unix()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byJob[x.jobID] = append(r.byJob[x.jobID], x)
	r.all = append(r.all, x)
	w.WriteHeader(http.StatusNoContent)
}

// runs is how often job id ran.
func (r *recorder) runs(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byJob[id])
}

// describe is job id's runs, for a report: the time each began and its
// attempt, as in "job-1 (10:00:01.2 #1, 10:00:31.9 #2)".
func (r *recorder) describe(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var runs []string
	for _, x := range r.byJob[id] {
		runs = append(runs, fmt.Sprintf("%s #%d", x.at.UTC().Format("15:04:05.0"), x.attempt))
	}
	return fmt.Sprintf("%s (%s)", id, strings.Join(runs, ", "))
}

// snapshot is every execution so far, in arrival order.
func (r *recorder) snapshot() []execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]execution(nil), r.all...)
}

func (r *recorder) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.Shutdown(ctx)
}
