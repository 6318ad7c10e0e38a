package accessaudit

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"slices"
	"unicode/utf8"
)

// MaxGrid is how many rows (sources) and columns (destination ports) the
// HTML picture draws at most; the rest is counted, and the JSON output has
// everything.
const MaxGrid = 300

// Geometry of the picture, in pixels.
const (
	cellSize  = 14
	charWidth = 7
	maxLabel  = 64 // characters of a row or column label
	margin    = 8
)

//go:embed page.html.tmpl
var pageTemplate string

var page = template.Must(template.New("page").Parse(pageTemplate))

// cell classes and what they mean.
var (
	matrixLegend = []legend{
		{"open", "allowed: nothing restricts the destination (no AccessPolicy, no deny by default)"},
		{"policy", "allowed by AccessPolicy"},
		{"conditional", "allowed by AccessPolicy for some requests only (paths, methods)"},
		{"none", "not allowed, or no route"},
	}
	diffLegend = []legend{
		{"added", "allowed after the change only"},
		{"removed", "allowed before the change only"},
		{"changed", "allowed before and after, differently (route, policies or conditions)"},
		{"none", "unchanged"},
	}
)

type legend struct{ Class, Text string }

type label struct {
	X, Y int
	Text string
	Full string
}

type cell struct {
	X, Y  int
	Class string
	Title string
}

type pageView struct {
	Title     string
	Summary   []string
	Width     int
	Height    int
	GridX     int
	GridY     int
	GridW     int
	GridH     int
	Rows      []label
	Cols      []label
	Cells     []cell
	Legend    []legend
	Truncated string
	Findings  []findingView
	Sections  []section
}

type findingView struct {
	Finding
	Subject string
}

type section struct {
	Title    string
	Findings []findingView
}

func findingViews(fs []Finding) []findingView {
	out := make([]findingView, len(fs))
	for i, f := range fs {
		out[i] = findingView{Finding: f}
		if len(f.Objects) > 0 {
			out[i].Subject = f.Objects[0]
		}
	}
	return out
}

func shorten(s string) string {
	if utf8.RuneCountInString(s) <= maxLabel {
		return s
	}
	r := []rune(s)
	return string(r[:maxLabel-1]) + "…"
}

// grid lays out rows × columns and places the cells given by class.
type grid struct {
	rows, cols   []string
	rowAt, colAt map[string]int
}

func newGrid(rows, cols []string) *grid {
	g := &grid{rowAt: map[string]int{}, colAt: map[string]int{}}
	for _, r := range rows {
		if _, ok := g.rowAt[r]; !ok && len(g.rows) < MaxGrid {
			g.rowAt[r] = len(g.rows)
			g.rows = append(g.rows, r)
		}
	}
	for _, c := range cols {
		if _, ok := g.colAt[c]; !ok && len(g.cols) < MaxGrid {
			g.colAt[c] = len(g.cols)
			g.cols = append(g.cols, c)
		}
	}
	return g
}

func (g *grid) view(v *pageView, totalRows, totalCols int, cells func(put func(row, col, class, title string))) {
	longest := func(xs []string) int {
		n := 0
		for _, x := range xs {
			n = max(n, utf8.RuneCountInString(shorten(x)))
		}
		return n
	}
	v.GridX = margin + longest(g.rows)*charWidth + margin
	v.GridY = margin + longest(g.cols)*charWidth + margin
	v.GridW, v.GridH = len(g.cols)*cellSize, len(g.rows)*cellSize
	v.Width, v.Height = v.GridX+v.GridW+margin, v.GridY+v.GridH+margin
	for i, r := range g.rows {
		v.Rows = append(v.Rows, label{X: v.GridX - margin/2, Y: v.GridY + i*cellSize + cellSize - 3, Text: shorten(r), Full: r})
	}
	for i, c := range g.cols {
		v.Cols = append(v.Cols, label{X: v.GridX + i*cellSize + cellSize - 3, Y: v.GridY - margin/2, Text: shorten(c), Full: c})
	}
	cells(func(row, col, class, title string) {
		i, ok := g.rowAt[row]
		j, ok2 := g.colAt[col]
		if ok && ok2 {
			v.Cells = append(v.Cells, cell{X: v.GridX + j*cellSize, Y: v.GridY + i*cellSize, Class: class, Title: title})
		}
	})
	if totalRows > len(g.rows) || totalCols > len(g.cols) {
		v.Truncated = fmt.Sprintf("The picture shows the first %d of %d sources and %d of %d destination ports; the JSON output (--output json) has all of them.",
			len(g.rows), totalRows, len(g.cols), totalCols)
	}
}

// columnName names a destination port: `<destination id>:<port>`.
func columnName(destination string, port int32) string { return destination + ":" + portText(port) }

func pairTitle(p Pair) string {
	return fmt.Sprintf("%s → %s (%s): %s", p.Source, columnName(p.Destination, p.Port), routeText(p), allowedBy(p))
}

// WriteHTML writes a Result as one self-contained HTML page: the matrix as
// an SVG grid of sources × destination ports, a legend, and the findings.
// Every name is escaped.
func WriteHTML(w io.Writer, r *Result) error {
	v := &pageView{Title: "Relaymesh access audit", Legend: matrixLegend, Findings: findingViews(r.Findings)}
	open := 0
	for _, p := range r.Matrix.Pairs {
		if p.Open {
			open++
		}
	}
	v.Summary = []string{
		fmt.Sprintf("%s (%d open) between %s and %s.", plural(len(r.Matrix.Pairs), "allowed pair", "allowed pairs"), open,
			plural(len(r.Matrix.Sources), "source identity", "source identities"), plural(len(r.Matrix.Destinations), "destination", "destinations")),
		fmt.Sprintf("%s.", plural(len(r.Findings), "finding", "findings")),
	}
	rows := make([]string, len(r.Matrix.Sources))
	for i, s := range r.Matrix.Sources {
		rows[i] = s.ID
	}
	var cols []string
	for _, d := range r.Matrix.Destinations {
		for _, p := range d.Ports {
			cols = append(cols, columnName(d.ID, p.Number))
		}
	}
	g := newGrid(rows, cols)
	g.view(v, len(rows), len(cols), func(put func(row, col, class, title string)) {
		for _, p := range r.Matrix.Pairs {
			class := "policy"
			switch {
			case p.Open:
				class = "open"
			case p.Conditional:
				class = "conditional"
			}
			put(p.Source, columnName(p.Destination, p.Port), class, pairTitle(p))
		}
	})
	return page.Execute(w, v)
}

// WriteDiffHTML writes a Diff as one self-contained HTML page: the changed
// pairs as an SVG grid (sources × destination ports that change), a legend,
// and the findings added and resolved.
func WriteDiffHTML(w io.Writer, d *Diff) error {
	v := &pageView{Title: "Relaymesh access audit: what-if", Legend: diffLegend}
	v.Summary = []string{fmt.Sprintf("%d pairs added, %d removed, %d changed; %d findings added, %d resolved.",
		len(d.Added), len(d.Removed), len(d.Changed), len(d.FindingsAdded), len(d.FindingsResolved))}
	v.Sections = []section{{"Findings added", findingViews(d.FindingsAdded)}, {"Findings resolved", findingViews(d.FindingsResolved)}}
	all := slices.Concat(d.Added, d.Removed)
	for _, c := range d.Changed {
		all = append(all, c.After)
	}
	slices.SortFunc(all, comparePairs)
	var rows, cols []string
	for _, p := range all {
		rows = append(rows, p.Source)
		cols = append(cols, columnName(p.Destination, p.Port))
	}
	slices.Sort(rows)
	rows = slices.Compact(rows)
	cols = uniqueInOrder(cols)
	g := newGrid(rows, cols)
	g.view(v, len(rows), len(cols), func(put func(row, col, class, title string)) {
		for _, p := range d.Added {
			put(p.Source, columnName(p.Destination, p.Port), "added", "added: "+pairTitle(p))
		}
		for _, p := range d.Removed {
			put(p.Source, columnName(p.Destination, p.Port), "removed", "removed: "+pairTitle(p))
		}
		for _, c := range d.Changed {
			put(c.After.Source, columnName(c.After.Destination, c.After.Port), "changed", "before: "+pairTitle(c.Before)+"; after: "+allowedBy(c.After))
		}
	})
	return page.Execute(w, v)
}

func uniqueInOrder(xs []string) []string {
	seen := map[string]bool{}
	out := make([]string, 0, len(xs))
	for _, x := range xs {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}
