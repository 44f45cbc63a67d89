package dashboard

import (
	"net/http"
	"sort"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

type agentsBody struct {
	Agents []jetfleet.AgentInfo
	Alive  int
	Dead   int
}

func (d *Dashboard) agents(w http.ResponseWriter, r *http.Request) {
	if _, err := parseFilter(r.URL.Query(), d.now(), 0); err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	res, err := d.client.Agents(ctx)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	b := &agentsBody{Agents: res.Agents}
	for _, a := range res.Agents {
		if a.State == jetfleet.AgentDead {
			b.Dead++
		} else {
			b.Alive++
		}
	}
	sort.SliceStable(b.Agents, func(i, j int) bool {
		return (b.Agents[i].State == jetfleet.AgentDead) != (b.Agents[j].State == jetfleet.AgentDead) && b.Agents[j].State == jetfleet.AgentDead
	})
	d.render(w, r, http.StatusOK, "agents", page{Title: "Agents", Nav: "agents", Live: "agents", Body: b})
}

type agentJobs struct {
	Agent jetfleet.AgentInfo
	Jobs  []jetfleet.RunningJob
}

type runningBody struct {
	Filter filter
	Groups []agentJobs
	Total  int
}

func (d *Dashboard) running(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query(), d.now(), 0, "queue", "kind", "agent")
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	ctx, cancel := d.requestCtx(r)
	defer cancel()
	res, err := d.client.RunningJobs(ctx, jetfleet.RunningJobsRequest{Queue: f.Queue, Kind: f.Kind, AgentID: f.AgentID})
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	agents, err := d.client.Agents(ctx)
	if err != nil {
		d.failErr(w, r, err)
		return
	}
	idx := map[string]int{}
	b := &runningBody{Filter: f, Total: len(res.Jobs)}
	for _, a := range agents.Agents {
		if a.State == jetfleet.AgentDead || (f.AgentID != "" && a.ID != f.AgentID) {
			continue
		}
		idx[a.ID] = len(b.Groups)
		b.Groups = append(b.Groups, agentJobs{Agent: a})
	}
	for _, j := range res.Jobs {
		i, ok := idx[j.AgentID]
		if !ok {
			i = len(b.Groups)
			idx[j.AgentID] = i
			b.Groups = append(b.Groups, agentJobs{Agent: jetfleet.AgentInfo{ID: j.AgentID}})
		}
		b.Groups[i].Jobs = append(b.Groups[i].Jobs, j)
	}
	d.render(w, r, http.StatusOK, "running", page{Title: "Running now", Nav: "running", Live: "running", Query: f.values(), Body: b})
}
