package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/relaymesh/relaymesh/api/crds"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/policy/manifest"
	"github.com/relaymesh/relaymesh/translation"
)

// The Access page is `relaymesh policy audit` in the browser: the same
// accessaudit.Audit over the same input, its matrix as a filterable table
// and a graph, its findings, and the what-if of a pasted change
// (accessaudit.WhatIf and Compare, as --with and --without). What is in
// force is decided as the server and the CLI decide it
// (all.InForce): the server's admission rules, and the statuses the
// server wrote (which also carry the verdicts of user rule sets), so an
// object the server refuses is neither in the matrix nor in the graph.

// Bounds of the Access page.
const (
	// maxGraphNodes per side: more sources or destinations than this are
	// drawn grouped by namespace, then by cluster.
	maxGraphNodes = 40
	// maxGraphEdges drawn; the table lists every pair.
	maxGraphEdges = 400
	// maxLabel characters of a node's label.
	maxLabel = 48
	// maxFilter characters of a filter.
	maxFilter = 256
)

// accessFilter narrows the table and the graph.
type accessFilter struct {
	// Query matches a source, destination or policy (substring, any case).
	Query string
	// Cluster matches the source's or the destination's cluster exactly.
	Cluster string
}

func accessFilterOf(r *http.Request) accessFilter {
	if r == nil {
		return accessFilter{}
	}
	q := r.URL.Query()
	return accessFilter{Query: text.Truncate(strings.TrimSpace(q.Get("q")), maxFilter), Cluster: text.Truncate(strings.TrimSpace(q.Get("cluster")), maxFilter)}
}

// accessCache keeps the last audit, for the input version it was computed
// from: the audit is a pure function of its input.
type accessCache struct {
	mu      sync.Mutex
	version string
	result  *accessaudit.Result
	in      *translation.Input

	// admission is the server's default rule set, built on first use.
	admission     *admission.Engine
	admissionErr  error
	admissionOnce sync.Once
	// schemas validate a pasted what-if, loaded on first use.
	schemas     *manifest.Schemas
	schemasErr  error
	schemasOnce sync.Once
}

// auditConfig is the audit's Config: admission as on the server, and the
// statuses the server wrote.
func (d *Dashboard) auditConfig() (accessaudit.Config, error) {
	c := d.access
	c.admissionOnce.Do(func() { c.admission, c.admissionErr = admission.New(admission.Config{Recorder: audit.Discard}) })
	if c.admissionErr != nil {
		return accessaudit.Config{}, c.admissionErr
	}
	return accessaudit.Config{AdminNamespace: d.cfg.Namespace, Admission: c.admission, ServerStatus: true}, nil
}

// AccessRow is one allowed (source, destination, port).
type AccessRow struct {
	Source        string `json:"source"`
	SourceCluster string `json:"sourceCluster"`
	// Destination is the destination's label (service.namespace @
	// cluster); DestinationID its matrix ID (cluster/namespace/service).
	Destination   string   `json:"destination"`
	DestinationID string   `json:"destinationID"`
	DestCluster   string   `json:"destinationCluster"`
	Port          int32    `json:"port"`
	Route         string   `json:"route"`
	Via           string   `json:"via,omitempty"`
	Open          bool     `json:"open"`
	Conditional   bool     `json:"conditional"`
	Policies      []string `json:"policies"`
	Conditions    string   `json:"conditions,omitempty"`
}

// accessPage is the Access page's data.
type accessPage struct {
	Result   *accessaudit.Result
	Filter   accessFilter
	Clusters []string
	Rows     []AccessRow
	// Matching counts the rows the filter matches; Rows holds the first.
	Matching int
	Total    int
	Graph    *graph
	Findings []accessaudit.Finding
	// Sources and Destinations count the matrix's.
	Sources, Destinations int
}

// auditNow returns the audit of the source's current input.
func (d *Dashboard) auditNow(ctx context.Context) (*accessaudit.Result, *translation.Input, error) {
	cfg, err := d.auditConfig()
	if err != nil {
		return nil, nil, err
	}
	c := d.access
	c.mu.Lock()
	defer c.mu.Unlock()
	version := d.cfg.Source.Version()
	if c.result != nil && version != "" && version == c.version {
		return c.result, c.in, nil
	}
	in, err := d.cfg.Source.Input()
	if err != nil {
		return nil, nil, err
	}
	res, err := accessaudit.Audit(ctx, in, cfg)
	if err != nil {
		return nil, nil, err
	}
	c.version, c.result, c.in = version, res, in
	return res, in, nil
}

func (d *Dashboard) accessPage(f accessFilter) (*accessPage, error) {
	// Each admission decision has its own deadline (admission.Config).
	res, _, err := d.auditNow(context.Background())
	if err != nil {
		return nil, err
	}
	return buildAccessPage(res, f, d.cfg.MaxAccessRows), nil
}

// buildAccessPage filters the matrix: the first max rows, the graph of
// every matching pair.
func buildAccessPage(res *accessaudit.Result, f accessFilter, max int) *accessPage {
	srcs := make(map[string]*accessaudit.Source, len(res.Matrix.Sources))
	for i := range res.Matrix.Sources {
		srcs[res.Matrix.Sources[i].ID] = &res.Matrix.Sources[i]
	}
	dsts := make(map[string]*accessaudit.Destination, len(res.Matrix.Destinations))
	clusters := map[string]bool{}
	for i := range res.Matrix.Destinations {
		dsts[res.Matrix.Destinations[i].ID] = &res.Matrix.Destinations[i]
		clusters[res.Matrix.Destinations[i].Cluster] = true
	}
	for _, s := range res.Matrix.Sources {
		if s.Cluster != "" { // a foreign identity (spiffeIDs) has none
			clusters[s.Cluster] = true
		}
	}
	p := &accessPage{Result: res, Filter: f, Total: len(res.Matrix.Pairs), Findings: res.Findings,
		Sources: len(res.Matrix.Sources), Destinations: len(res.Matrix.Destinations)}
	for c := range clusters {
		p.Clusters = append(p.Clusters, c)
	}
	sort.Strings(p.Clusters)
	q := strings.ToLower(f.Query)
	var matched []AccessRow
	for _, pair := range res.Matrix.Pairs {
		row := AccessRow{Source: pair.Source, Destination: pair.Destination, DestinationID: pair.Destination, Port: pair.Port, Route: pair.Route, Via: pair.Via,
			Open: pair.Open, Conditional: pair.Conditional, Policies: []string{}}
		if s := srcs[pair.Source]; s != nil {
			row.SourceCluster = s.Cluster
		}
		if dst := dsts[pair.Destination]; dst != nil {
			row.DestCluster = dst.Cluster
			row.Destination = dst.Service + "." + dst.Namespace + " @ " + dst.Cluster
		}
		var conds []string
		for _, g := range pair.Grants {
			row.Policies = append(row.Policies, g.Policy)
			if g.Conditional() {
				conds = append(conds, conditions(g))
			}
		}
		row.Conditions = strings.Join(conds, "; ")
		if f.Cluster != "" && row.SourceCluster != f.Cluster && row.DestCluster != f.Cluster {
			continue
		}
		if q != "" && !strings.Contains(strings.ToLower(row.Source), q) && !strings.Contains(strings.ToLower(row.Destination), q) &&
			!slices.ContainsFunc(row.Policies, func(s string) bool { return strings.Contains(strings.ToLower(s), q) }) {
			continue
		}
		matched = append(matched, row)
	}
	p.Matching = len(matched)
	p.Rows = matched[:min(len(matched), max)]
	p.Graph = buildGraph(matched, srcs, dsts)
	return p
}

func conditions(g accessaudit.Grant) string {
	var parts []string
	if len(g.Methods) > 0 {
		parts = append(parts, strings.Join(g.Methods, ","))
	}
	if len(g.Paths) > 0 {
		parts = append(parts, strings.Join(g.Paths, ","))
	}
	for _, p := range g.Ports {
		parts = append(parts, "port "+strconv.Itoa(int(p)))
	}
	return g.Policy + ": " + strings.Join(parts, " ")
}

// graph is the Access graph: sources on the left, destinations on the
// right, an edge per (source, destination) that some port allows, with the
// policies that allow it. Drawn as SVG by the template; every label is
// text the template escapes.
type graph struct {
	Width, Height int
	// Grouping says what a node is: "identity" (a source identity or a
	// destination service), "namespace" or "cluster".
	Grouping string
	Left     []gnode
	Right    []gnode
	Edges    []gedge
	// Dropped counts edges not drawn beyond maxGraphEdges.
	Dropped int
	Empty   bool
}

type gnode struct {
	ID, Label, Cluster string
	// Color is a palette index (class c0…c7) per cluster.
	Color  int
	X, Y   int
	Anchor string
}

type gedge struct {
	Source, Destination string
	Path                string
	// Class: open, policy or conditional; Remote: crosses clusters.
	Class    string
	Remote   bool
	Policies []string
	Ports    string
	Title    string
}

// Graph geometry, in pixels.
const (
	graphWidth  = 1000
	rowHeight   = 24
	graphMargin = 20
	leftX       = 330
	rightX      = 670
)

func buildGraph(rows []AccessRow, srcs map[string]*accessaudit.Source, dsts map[string]*accessaudit.Destination) *graph {
	g := &graph{Width: graphWidth, Grouping: "identity"}
	if len(rows) == 0 {
		g.Empty, g.Height = true, 2*graphMargin
		return g
	}
	type side struct{ id, label, cluster string }
	keyOf := func(level int, cluster, namespace, id, label string) side {
		switch level {
		case 1:
			return side{cluster + "/" + namespace, namespace + " @ " + cluster, cluster}
		case 2:
			return side{cluster, "cluster " + cluster, cluster}
		}
		return side{id, label, cluster}
	}
	nodesOf := func(level int) (map[string]side, map[string]side, map[[2]string][]AccessRow) {
		left, right := map[string]side{}, map[string]side{}
		edges := map[[2]string][]AccessRow{}
		for _, r := range rows {
			var ls, rs side
			if s := srcs[r.Source]; s != nil {
				ls = keyOf(level, s.Cluster, s.Namespace, s.ID, s.ID)
			} else {
				ls = side{r.Source, r.Source, r.SourceCluster}
			}
			if d := dsts[r.DestinationID]; d != nil {
				rs = keyOf(level, d.Cluster, d.Namespace, d.ID, d.Service+"."+d.Namespace+" @ "+d.Cluster)
			} else {
				rs = side{r.Destination, r.Destination, r.DestCluster}
			}
			left[ls.id], right[rs.id] = ls, rs
			k := [2]string{ls.id, rs.id}
			edges[k] = append(edges[k], r)
		}
		return left, right, edges
	}
	var left, right map[string]side
	var edges map[[2]string][]AccessRow
	for level, name := range []string{"identity", "namespace", "cluster"} {
		left, right, edges = nodesOf(level)
		g.Grouping = name
		if len(left) <= maxGraphNodes && len(right) <= maxGraphNodes {
			break
		}
	}
	palette := map[string]int{}
	color := func(cluster string) int {
		c, ok := palette[cluster]
		if !ok {
			c = len(palette) % 8
			palette[cluster] = c
		}
		return c
	}
	place := func(m map[string]side, x int, anchor string) ([]gnode, map[string]int) {
		list := make([]side, 0, len(m))
		for _, s := range m {
			list = append(list, s)
		}
		sort.Slice(list, func(i, j int) bool {
			if list[i].cluster != list[j].cluster {
				return list[i].cluster < list[j].cluster
			}
			return list[i].label < list[j].label
		})
		nodes := make([]gnode, 0, len(list))
		y := map[string]int{}
		for i, s := range list {
			n := gnode{ID: s.id, Label: text.Truncate(s.label, maxLabel), Cluster: s.cluster, Color: color(s.cluster), X: x, Y: graphMargin + i*rowHeight + rowHeight/2, Anchor: anchor}
			y[s.id] = n.Y
			nodes = append(nodes, n)
		}
		return nodes, y
	}
	allClusters := map[string]bool{}
	for _, s := range left {
		allClusters[s.cluster] = true
	}
	for _, s := range right {
		allClusters[s.cluster] = true
	}
	for _, c := range slices.Sorted(mapKeys(allClusters)) {
		color(c)
	}
	var ly, ry map[string]int
	g.Left, ly = place(left, leftX, "end")
	g.Right, ry = place(right, rightX, "start")
	g.Height = 2*graphMargin + max(len(g.Left), len(g.Right))*rowHeight
	keys := make([][2]string, 0, len(edges))
	for k := range edges {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i][0] != keys[j][0] {
			return keys[i][0] < keys[j][0]
		}
		return keys[i][1] < keys[j][1]
	})
	if len(keys) > maxGraphEdges {
		g.Dropped = len(keys) - maxGraphEdges
		keys = keys[:maxGraphEdges]
	}
	for _, k := range keys {
		rs := edges[k]
		e := gedge{Source: k[0], Destination: k[1], Class: "open"}
		policies, ports := map[string]bool{}, map[int32]bool{}
		allConditional := true
		for _, r := range rs {
			for _, p := range r.Policies {
				policies[p] = true
			}
			ports[r.Port] = true
			if !r.Conditional {
				allConditional = false
			}
			if !r.Open {
				e.Class = "policy"
			}
			if r.SourceCluster != r.DestCluster {
				e.Remote = true
			}
		}
		if e.Class == "policy" && allConditional {
			e.Class = "conditional"
		}
		e.Policies = slices.Sorted(mapKeys(policies))
		var ps []string
		for _, p := range slices.Sorted(mapKeys(ports)) {
			ps = append(ps, strconv.Itoa(int(p)))
		}
		e.Ports = strings.Join(ps, ",")
		y1, y2 := ly[k[0]], ry[k[1]]
		x1, x2 := leftX+8, rightX-8
		mid := (x1 + x2) / 2
		e.Path = fmt.Sprintf("M %d %d C %d %d, %d %d, %d %d", x1, y1, mid, y1, mid, y2, x2, y2)
		why := "open: nothing restricts the destination"
		if len(e.Policies) > 0 {
			why = "allowed by " + strings.Join(e.Policies, ", ")
		}
		e.Title = fmt.Sprintf("%s → %s, port %s: %s", left[k[0]].label, right[k[1]].label, e.Ports, why)
		g.Edges = append(g.Edges, e)
	}
	return g
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// whatIfPage is the what-if result.
type whatIfPage struct {
	With    string
	Without string
	Diff    *accessaudit.Diff
	Error   string
}

// whatIf audits the current input changed by a pasted YAML (objects added
// or replaced) and removals (KIND/NAMESPACE/NAME lines), and shows the
// difference in access. It changes nothing anywhere.
func (d *Dashboard) whatIf(w http.ResponseWriter, r *http.Request) {
	user, csrf, fromCookie, err := d.caller(r)
	if err == nil {
		err = d.authorize(r.Context(), user, ViewAccess)
	}
	if err != nil {
		d.refuse(w, r, ViewAccess, err)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxWhatIf)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, fmt.Sprintf("the what-if form is larger than %d bytes", maxWhatIf), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "the form could not be read", http.StatusBadRequest)
		return
	}
	if !checkCSRF(r, csrf, fromCookie) {
		http.Error(w, "form token missing or wrong", http.StatusForbidden)
		return
	}
	p := &pageData{Title: "What if", View: ViewAccess, Nav: d.nav(ViewAccess), User: user.Username, CSRF: csrf, Now: d.cfg.Clock().UTC()}
	page := &whatIfPage{With: r.PostFormValue("with"), Without: r.PostFormValue("without")}
	p.Data = page
	diff, status, err := d.diff(r.Context(), page.With, page.Without)
	if err != nil {
		page.Error = err.Error()
		d.render(w, status, "whatif", p)
		return
	}
	page.Diff = diff
	d.render(w, http.StatusOK, "whatif", p)
}

// diff is the what-if: status is the HTTP status of an error.
func (d *Dashboard) diff(ctx context.Context, with, without string) (*accessaudit.Diff, int, error) {
	var refs []accessaudit.Ref
	for _, line := range strings.Split(without, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		ref, err := accessaudit.ParseRef(line)
		if err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("remove: %w", err)
		}
		refs = append(refs, ref)
	}
	var change *translation.Input
	if strings.TrimSpace(with) != "" {
		var err error
		if change, err = d.readChange(ctx, with); err != nil {
			return nil, http.StatusBadRequest, fmt.Errorf("add or replace: %w", err)
		}
	}
	if change == nil && len(refs) == 0 {
		return nil, http.StatusBadRequest, errors.New("paste objects to add or replace, or name objects to remove")
	}
	before, in, err := d.auditNow(ctx)
	if err != nil {
		return nil, http.StatusServiceUnavailable, err
	}
	proposed, err := accessaudit.WhatIf(in, change, refs)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	cfg, err := d.auditConfig()
	if err != nil {
		return nil, http.StatusServiceUnavailable, err
	}
	// A pasted object is judged by admission as if it were applied.
	after, err := accessaudit.Audit(ctx, proposed, cfg)
	if err != nil {
		return nil, http.StatusBadRequest, fmt.Errorf("with the change: %w", err)
	}
	return accessaudit.Compare(before, after), http.StatusOK, nil
}

// maxProblems is how many of a pasted YAML's problems the what-if names.
const maxProblems = 5

// readChange reads a pasted YAML as `policy audit --with` reads a file
// (policy/manifest): every Relaymesh object checked as the API server
// would (schema, CEL, apiVersion); an object it would refuse is an error
// naming the field, not a change.
func (d *Dashboard) readChange(ctx context.Context, with string) (*translation.Input, error) {
	c := d.access
	c.schemasOnce.Do(func() { c.schemas, c.schemasErr = manifest.LoadSchemas(crds.FS) })
	if c.schemasErr != nil {
		return nil, c.schemasErr
	}
	w, err := manifest.Read(ctx, manifest.Config{Schemas: c.schemas, AdminNamespace: d.cfg.Namespace, MaxBytes: maxWhatIf, MaxFiles: 1},
		strings.NewReader(with), manifest.Stdin)
	if err != nil {
		return nil, err
	}
	if n := len(w.Problems); n > 0 {
		var msgs []string
		for _, p := range w.Problems[:min(n, maxProblems)] {
			msgs = append(msgs, strings.TrimPrefix(p.String(), manifest.Stdin+": "))
		}
		if n > maxProblems {
			msgs = append(msgs, fmt.Sprintf("and %d more", n-maxProblems))
		}
		return nil, fmt.Errorf("the API server would refuse it: %s", strings.Join(msgs, "; "))
	}
	if accessaudit.Count(w.Input) == 0 {
		return nil, errors.New("the YAML holds no Relaymesh object")
	}
	return w.Input, nil
}
