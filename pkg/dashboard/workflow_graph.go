package dashboard

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/jetfleet/jetfleet/pkg/jetfleet"
	"github.com/jetfleet/jetfleet/pkg/protocol"
)

// A workflow run's graph, drawn on the server as inline SVG like the
// charts: a layered layout of the steps from their depends_on (a step's
// layer, its column, is the longest path to it from a step that depends on
// nothing), each box coloured by its status, with the counts of a fan-out's
// elements, and an arrow from each step to each step that depends on it.
// The template (workflowrun.html) draws what graphLayout computes.

// Sizes of the drawing, in SVG user units (pixels at 100%).
const (
	graphBoxW  = 252
	graphBoxH  = 76
	graphGapX  = 56
	graphGapY  = 26
	graphPad   = 14
	graphStack = 4 // the offset of the cards drawn behind a fan-out's box
)

// graph is a laid out run: boxes and arrows with their coordinates.
type graph struct {
	Width, Height int
	Nodes         []graphNode
	Edges         []graphEdge
	// Layers is the number of columns.
	Layers int
}

// graphNode is one step's box.
type graphNode struct {
	Name, Kind, Queue, Status, When string
	// Layer and Row place the box: column Layer, Row-th from the top.
	Layer, Row int
	X, Y, W, H int
	FanOut     bool
	// Counts are what a fan-out's elements did (3 succeeded · 1 failed ·
	// 0 running, then any waiting or cancelled); Failed marks a box with
	// failed or cancelled elements.
	Counts []countPart
	Failed bool
	Error  string
	// Label, Meta and Note are the box's lines as drawn (shortened); the
	// *Fit fields, when not zero, squeeze a line that would overflow the
	// box into its width (SVG textLength).
	Label, Meta, Note                    string
	LabelFit, MetaFit, StateFit, NoteFit int
	Tags                                 []graphTag
	// Title is the box's tooltip and accessible name.
	Title string
}

// countPart is one status's count of a fan-out's elements.
type countPart struct {
	N      int
	Status string
}

func (c countPart) String() string { return strconv.Itoa(c.N) + " " + c.Status }

// graphTag is a label on a box's top border: fan-out, on failure, always.
type graphTag struct {
	Text  string
	Class string
	// X and W place its pill, CX the middle of its text.
	X, W, CX int
}

// graphEdge is an arrow from a step to one that depends on it.
type graphEdge struct {
	From, To string
	// Path is the SVG path (a cubic curve from the right side of From to
	// the left side of To).
	Path string
	// When is the dependent step's condition (on_failure, always): the
	// arrow is drawn dashed.
	When string
}

// graphLayers computes each step's layer: 0 for a step with no (known)
// dependency, else one more than the highest layer among its
// dependencies. Unknown dependencies are ignored, and a cycle (which a
// validated definition cannot have) is cut where the walk meets it again,
// so every step gets a layer whatever the input.
func graphLayers(steps []jetfleet.WorkflowStepView) map[string]int {
	index := make(map[string]int, len(steps))
	for i, s := range steps {
		if _, dup := index[s.Name]; !dup {
			index[s.Name] = i
		}
	}
	layer := make(map[string]int, len(steps))
	const (
		unseen = iota
		visiting
		done
	)
	state := make(map[string]int, len(steps))
	var visit func(name string) int
	visit = func(name string) int {
		switch state[name] {
		case done:
			return layer[name]
		case visiting:
			return -1 // a cycle: this edge does not count
		}
		state[name] = visiting
		l := 0
		for _, dep := range steps[index[name]].DependsOn {
			if _, ok := index[dep]; !ok || dep == name {
				continue
			}
			if dl := visit(dep); dl >= 0 {
				l = max(l, dl+1)
			}
		}
		state[name] = done
		layer[name] = l
		return l
	}
	for _, s := range steps {
		visit(s.Name)
	}
	return layer
}

// graphLayout lays out a run's steps: columns by layer, and in each column
// the steps ordered by the mean row of their dependencies (the barycentre,
// which keeps arrows short and few crossing), the definition's order
// breaking ties. fanOut says which steps are fan-outs beyond those whose
// elements the run lists.
func graphLayout(steps []jetfleet.WorkflowStepView, fanOut map[string]bool) *graph {
	layers := graphLayers(steps)
	g := &graph{}
	byLayer := map[int][]int{}
	seen := map[string]bool{}
	for i, s := range steps {
		if seen[s.Name] {
			continue
		}
		seen[s.Name] = true
		l := layers[s.Name]
		byLayer[l] = append(byLayer[l], i)
		g.Layers = max(g.Layers, l+1)
	}
	row := map[string]int{}
	maxRows := 0
	for l := 0; l < g.Layers; l++ {
		col := byLayer[l]
		if l > 0 {
			centre := make(map[int]float64, len(col))
			for _, i := range col {
				sum, n := 0.0, 0
				for _, dep := range steps[i].DependsOn {
					if r, ok := row[dep]; ok && layers[dep] < l {
						sum += float64(r)
						n++
					}
				}
				if n > 0 {
					centre[i] = sum / float64(n)
				}
			}
			sort.SliceStable(col, func(a, b int) bool { return centre[col[a]] < centre[col[b]] })
		}
		for r, i := range col {
			row[steps[i].Name] = r
		}
		maxRows = max(maxRows, len(col))
	}
	if maxRows == 0 {
		return g
	}
	// Room above each box for its tags, beside each for a fan-out's cards.
	top := graphPad + 10
	g.Width = 2*graphPad + g.Layers*graphBoxW + (g.Layers-1)*graphGapX + graphStack*2
	g.Height = top + graphPad + maxRows*graphBoxH + (maxRows-1)*graphGapY + graphStack*2
	pos := map[string]*graphNode{}
	for l := 0; l < g.Layers; l++ {
		col := byLayer[l]
		// Centre a shorter column beside the tallest.
		offset := (maxRows - len(col)) * (graphBoxH + graphGapY) / 2
		for r, i := range col {
			g.Nodes = append(g.Nodes, newGraphNode(steps[i], fanOut[steps[i].Name], l, r,
				graphPad+l*(graphBoxW+graphGapX), top+graphStack*2+offset+r*(graphBoxH+graphGapY)))
		}
	}
	for i := range g.Nodes {
		pos[g.Nodes[i].Name] = &g.Nodes[i]
	}
	for _, n := range g.Nodes {
		s := steps[indexOf(steps, n.Name)]
		done := map[string]bool{}
		for _, dep := range s.DependsOn {
			from := pos[dep]
			if from == nil || dep == n.Name || done[dep] {
				continue
			}
			done[dep] = true
			g.Edges = append(g.Edges, graphEdge{From: dep, To: n.Name, When: n.When, Path: edgePath(from, pos[n.Name])})
		}
	}
	return g
}

func indexOf(steps []jetfleet.WorkflowStepView, name string) int {
	for i, s := range steps {
		if s.Name == name {
			return i
		}
	}
	return -1
}

// edgePath is a curve from the middle of from's right side to the middle
// of to's left side (or, for an edge that goes back or stays in a column,
// which only a cycle makes, around the boxes' left sides).
func edgePath(from, to *graphNode) string {
	x1, y1 := from.X+from.W, from.Y+from.H/2
	x2, y2 := to.X-3, to.Y+to.H/2 // the arrowhead ends at the border
	if x2 <= x1 {
		x1 = from.X
		bend := min(from.X, to.X) - graphGapX/2
		return fmt.Sprintf("M%d %d C%d %d %d %d %d %d", x1, y1, bend, y1, bend, y2, x2, y2)
	}
	mid := (x1 + x2) / 2
	return fmt.Sprintf("M%d %d C%d %d %d %d %d %d", x1, y1, mid, y1, mid, y2, x2, y2)
}

func newGraphNode(s jetfleet.WorkflowStepView, fanOut bool, layer, row, x, y int) graphNode {
	n := graphNode{Name: s.Name, Kind: s.Kind, Queue: s.Queue, Status: s.Status, When: s.When, Layer: layer, Row: row,
		X: x, Y: y, W: graphBoxW, H: graphBoxH, FanOut: s.Elements != nil || fanOut, Error: s.Error}
	if n.Status == "" {
		n.Status = jetfleet.WorkflowWaiting
	}
	n.Label = shorten(n.Name, 28)
	n.Meta = shorten(n.Kind+" · "+n.Queue, 38)
	var tags []string
	counts := ""
	if n.FanOut {
		n.Counts, n.Failed = elementCounts(s.Elements)
		counts = countsText(n.Counts)
		total := 0
		for _, c := range s.Elements {
			total += c
		}
		if total > 0 {
			tags = append(tags, "fan-out ×"+strconv.Itoa(total))
		} else {
			tags = append(tags, "fan-out")
		}
		// The counts beyond the first three go on the last line.
		if len(n.Counts) > 3 {
			var extra []string
			for _, c := range n.Counts[3:] {
				extra = append(extra, c.String())
			}
			n.Note = strings.Join(extra, " · ")
			n.Counts = n.Counts[:3]
		}
	}
	switch n.When {
	case protocol.WhenOnFailure:
		tags = append(tags, "on failure")
	case protocol.WhenAlways:
		tags = append(tags, "always")
	}
	if n.Note == "" && n.Error != "" {
		n.Note = shorten(n.Error, 40)
	}
	// Tags sit on the box's top border, from its right end leftwards.
	right := n.X + n.W - 10
	for _, t := range tags {
		w := 12 + 6*len([]rune(t))
		class := "t-fanout"
		switch t {
		case "on failure":
			class = "t-onfailure"
		case "always":
			class = "t-always"
		}
		n.Tags = append(n.Tags, graphTag{Text: t, Class: class, X: right - w, W: w, CX: right - w/2})
		right -= w + 6
	}
	inner := n.W - 24
	n.LabelFit = fit(n.Label, 8.6, inner)
	n.MetaFit = fit(n.Meta, 6.9, inner)
	state := n.Status
	if n.FanOut {
		state = countsText(n.Counts)
	}
	n.StateFit = fit(state, 6.9, inner)
	n.NoteFit = fit(n.Note, 6.2, inner)
	n.Title = nodeTitle(n, counts)
	return n
}

// fit returns the width to squeeze text into when its estimated width (at
// perChar units a character, a generous mean for the fonts of the
// stylesheet) exceeds width; zero when it fits.
func fit(text string, perChar float64, width int) int {
	if float64(len([]rune(text)))*perChar <= float64(width) {
		return 0
	}
	return width
}

// elementStatuses is the order a fan-out's counts are written in.
var elementStatuses = []string{jetfleet.WorkflowSucceeded, jetfleet.WorkflowFailed, jetfleet.WorkflowRunning,
	jetfleet.WorkflowWaiting, jetfleet.WorkflowCancelled, jetfleet.WorkflowSkipped}

// elementCounts lists a fan-out's counts: succeeded, failed and running
// always, then the other statuses that have elements; failed reports
// failed or cancelled elements.
func elementCounts(counts map[string]int) ([]countPart, bool) {
	var parts []countPart
	known := map[string]bool{}
	for i, st := range elementStatuses {
		known[st] = true
		if n := counts[st]; n > 0 || i < 3 {
			parts = append(parts, countPart{N: n, Status: st})
		}
	}
	var other []string
	for st, n := range counts {
		if !known[st] && n > 0 {
			other = append(other, st)
		}
	}
	sort.Strings(other)
	for _, st := range other {
		parts = append(parts, countPart{N: counts[st], Status: st})
	}
	return parts, counts[jetfleet.WorkflowFailed]+counts[jetfleet.WorkflowCancelled] > 0
}

// countsText writes counts as "3 succeeded · 1 failed · 0 running".
func countsText(parts []countPart) string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p.String()
	}
	return strings.Join(out, " · ")
}

// nodeTitle is a box's tooltip: the step in words, with all the counts of
// a fan-out's elements.
func nodeTitle(n graphNode, counts string) string {
	t := "step " + n.Name + ": " + n.Status + ", kind " + n.Kind + " on queue " + n.Queue
	if n.FanOut {
		t += ", a fan-out: " + counts
	}
	switch n.When {
	case protocol.WhenOnFailure:
		t += "; runs only when something upstream failed"
	case protocol.WhenAlways:
		t += "; runs whatever happened upstream"
	}
	if n.Error != "" {
		t += "; error: " + shorten(n.Error, 300)
	}
	return t
}
