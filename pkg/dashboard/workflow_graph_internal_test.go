package dashboard

import (
	"errors"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
)

// steps builds step views from "name:dep,dep" specs.
func steps(specs ...[]string) []jetfleet.WorkflowStepView {
	var out []jetfleet.WorkflowStepView
	for _, s := range specs {
		out = append(out, jetfleet.WorkflowStepView{Name: s[0], Kind: "echo", Queue: "default", DependsOn: s[1:], Status: jetfleet.WorkflowWaiting})
	}
	return out
}

// TestGraphLayers: a step's layer is the longest path to it from a root;
// unknown dependencies, a step depending on itself and a cycle (which a
// validated definition cannot hold) still give every step a layer.
func TestGraphLayers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		steps []jetfleet.WorkflowStepView
		want  map[string]int
	}{
		{"one step", steps([]string{"a"}), map[string]int{"a": 0}},
		{"chain", steps([]string{"a"}, []string{"b", "a"}, []string{"c", "b"}), map[string]int{"a": 0, "b": 1, "c": 2}},
		{"chain listed backwards", steps([]string{"c", "b"}, []string{"b", "a"}, []string{"a"}), map[string]int{"a": 0, "b": 1, "c": 2}},
		{"diamond", steps([]string{"a"}, []string{"b", "a"}, []string{"c", "a"}, []string{"d", "b", "c"}),
			map[string]int{"a": 0, "b": 1, "c": 1, "d": 2}},
		{"longest path wins", steps([]string{"a"}, []string{"b", "a"}, []string{"c", "b"}, []string{"d", "a", "c"}),
			map[string]int{"a": 0, "b": 1, "c": 2, "d": 3}},
		{"two roots", steps([]string{"a"}, []string{"x"}, []string{"y", "x", "a"}), map[string]int{"a": 0, "x": 0, "y": 1}},
		{"unknown dependency ignored", steps([]string{"a", "ghost"}, []string{"b", "a", "ghost"}), map[string]int{"a": 0, "b": 1}},
		{"self dependency ignored", steps([]string{"a", "a"}, []string{"b", "a"}), map[string]int{"a": 0, "b": 1}},
		{"cycle cut", steps([]string{"a", "c"}, []string{"b", "a"}, []string{"c", "b"}), map[string]int{"a": 2, "b": 0, "c": 1}},
		{"duplicate name keeps the first", steps([]string{"a"}, []string{"b", "a"}, []string{"a", "b"}), map[string]int{"a": 0, "b": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tc.want, graphLayers(tc.steps))
		})
	}
}

// TestGraphLayout: boxes in columns by layer, no two overlapping, inside
// the drawing; one arrow per known dependency, from left to right; a
// fan-out's counts and tags; a column ordered by its dependencies' rows.
func TestGraphLayout(t *testing.T) {
	t.Parallel()
	s := steps([]string{"list"}, []string{"other"}, []string{"export", "list"}, []string{"audit", "other"},
		[]string{"report", "export", "audit", "ghost"}, []string{"page", "export"})
	s[2].Elements = map[string]int{"succeeded": 7, "failed": 2, "running": 1, "waiting": 3}
	s[2].Status = jetfleet.WorkflowRunning
	s[5].When = "on_failure"
	s[4].When = "always"
	g := graphLayout(s, map[string]bool{"audit": true})
	require.Len(t, g.Nodes, 6)
	assert.Equal(t, 3, g.Layers)
	by := map[string]graphNode{}
	for _, n := range g.Nodes {
		by[n.Name] = n
		assert.GreaterOrEqual(t, n.X, 0, n.Name)
		assert.GreaterOrEqual(t, n.Y-9, 0, "%s: its tags are inside the drawing", n.Name)
		assert.LessOrEqual(t, n.X+n.W+2*graphStack, g.Width, n.Name)
		assert.LessOrEqual(t, n.Y+n.H, g.Height, n.Name)
		assert.Equal(t, graphPad+n.Layer*(graphBoxW+graphGapX), n.X, "%s: its column is its layer", n.Name)
	}
	for i, a := range g.Nodes {
		for _, b := range g.Nodes[i+1:] {
			overlap := a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
			assert.False(t, overlap, "%s and %s overlap", a.Name, b.Name)
		}
	}
	assert.Equal(t, 0, by["list"].Layer)
	assert.Equal(t, 1, by["export"].Layer)
	assert.Equal(t, 2, by["report"].Layer)
	// audit depends on other (row 1): it comes after export (under list, row 0).
	assert.Less(t, by["export"].Row, by["audit"].Row)

	edges := map[string]graphEdge{}
	for _, e := range g.Edges {
		edges[e.From+">"+e.To] = e
		from, to := by[e.From], by[e.To]
		assert.Less(t, from.X, to.X, "%s → %s goes right", e.From, e.To)
		assert.Regexp(t, `^M\d+ \d+ C\d+ \d+ \d+ \d+ \d+ \d+$`, e.Path)
	}
	assert.Len(t, edges, 5, "every known dependency, the unknown one left out: %v", edges)
	assert.Equal(t, "on_failure", edges["export>page"].When)

	ex := by["export"]
	assert.True(t, ex.FanOut)
	assert.True(t, ex.Failed, "a fan-out with failed elements is marked")
	assert.Equal(t, "7 succeeded · 2 failed · 1 running", countsText(ex.Counts))
	assert.Equal(t, "3 waiting", ex.Note)
	assert.Contains(t, ex.Title, "7 succeeded · 2 failed · 1 running · 3 waiting")
	require.Len(t, ex.Tags, 1)
	assert.Equal(t, "fan-out ×13", ex.Tags[0].Text)
	au := by["audit"]
	assert.True(t, au.FanOut, "a fan-out by its definition before its list is known")
	assert.False(t, au.Failed)
	assert.Equal(t, "0 succeeded · 0 failed · 0 running", countsText(au.Counts))
	assert.Equal(t, "fan-out", au.Tags[0].Text)
	assert.False(t, by["list"].FanOut)
	assert.Equal(t, "on failure", by["page"].Tags[0].Text)
	assert.Equal(t, "always", by["report"].Tags[0].Text)
}

// TestGraphLayoutOfACycle: a cycle still draws every box, once.
func TestGraphLayoutOfACycle(t *testing.T) {
	t.Parallel()
	g := graphLayout(steps([]string{"a", "c"}, []string{"b", "a"}, []string{"c", "b"}), nil)
	require.Len(t, g.Nodes, 3)
	assert.Len(t, g.Edges, 3)
	assert.Positive(t, g.Width)
	assert.Empty(t, graphLayout(nil, nil).Nodes)
}

// FuzzParseWorkflowFilter: no query string makes /workflows's filter
// parser panic or answer anything but a queryError, and whatever it
// accepts it writes back to a query it accepts again, unchanged.
func FuzzParseWorkflowFilter(f *testing.F) {
	for _, seed := range []string{
		"workflow=nightly-export&status=failed&limit=20", "status=running", "workflow=a.b", "status=waiting",
		"limit=0", "limit=1001", "status=failed&status=running", "color=red", "workflow=%3Cscript%3E", "%zz", "fragment=1",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		fl, err := parseWorkflowFilter(q)
		if err != nil {
			var qe *queryError
			if !errors.As(err, &qe) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		again, err := parseWorkflowFilter(fl.values())
		if err != nil {
			t.Fatalf("the filter %+v written back is refused: %v", fl, err)
		}
		if again != fl {
			t.Fatalf("round trip changed the filter: %+v → %+v", fl, again)
		}
		if err := (jetfleet.WorkflowRunsRequest{Workflow: fl.Workflow, Status: fl.Status, Limit: fl.Limit}).Validate(); err != nil {
			t.Fatalf("an accepted filter %+v makes a request the supervisor refuses: %v", fl, err)
		}
	})
}
