package accessaudit

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes v (a Result or a Diff) as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func portText(p int32) string {
	if p == 0 {
		return "*"
	}
	return strconv.Itoa(int(p))
}

func routeText(p Pair) string {
	if p.Via != "" {
		return p.Route + " via " + p.Via
	}
	return p.Route
}

// allowedBy says why a pair is allowed, with the conditions of each grant.
func allowedBy(p Pair) string {
	if p.Open {
		return "open (no AccessPolicy)"
	}
	parts := make([]string, len(p.Grants))
	for i, g := range p.Grants {
		parts[i] = g.Policy
		if c := conditions(g); c != "" {
			parts[i] += " [" + c + "]"
		}
	}
	return strings.Join(parts, ", ")
}

// conditions is a grant's restrictions, "" when it allows every request.
func conditions(g Grant) string {
	var c []string
	if len(g.Methods) > 0 {
		c = append(c, "methods "+strings.Join(g.Methods, ","))
	}
	if len(g.Paths) > 0 {
		c = append(c, "paths "+strings.Join(g.Paths, ","))
	}
	if len(g.Ports) > 0 {
		ps := make([]string, len(g.Ports))
		for i, p := range g.Ports {
			ps[i] = strconv.Itoa(int(p))
		}
		c = append(c, "ports "+strings.Join(ps, ","))
	}
	return strings.Join(c, "; ")
}

// WriteTable writes a Result as aligned text: the matrix, then the findings.
func WriteTable(w io.Writer, r *Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	writeInput(row, r.Input)
	open := 0
	for _, p := range r.Matrix.Pairs {
		if p.Open {
			open++
		}
	}
	row(fmt.Sprintf("ACCESS MATRIX: %s (%d open) between %s and %s",
		plural(len(r.Matrix.Pairs), "allowed pair", "allowed pairs"), open,
		plural(len(r.Matrix.Sources), "source identity", "source identities"), plural(len(r.Matrix.Destinations), "destination", "destinations")))
	if len(r.Matrix.Pairs) > 0 {
		row("SOURCE", "DESTINATION", "PORT", "ROUTE", "ALLOWED BY")
		for _, p := range r.Matrix.Pairs {
			row(p.Source, p.Destination, portText(p.Port), routeText(p), allowedBy(p))
		}
	}
	row("")
	writeFindings(row, "FINDINGS", r.Findings)
	return tw.Flush()
}

func writeFindings(row func(...string), title string, fs []Finding) {
	row(fmt.Sprintf("%s: %d", title, len(fs)))
	if len(fs) == 0 {
		return
	}
	row("SEVERITY", "KIND", "SUBJECT", "MESSAGE")
	for _, f := range fs {
		subject := ""
		if len(f.Objects) > 0 {
			subject = f.Objects[0]
		}
		row(f.Severity, f.Kind, subject, f.Message)
	}
}

// WriteDiffTable writes a Diff as aligned text: `+` added, `-` removed and
// `~` changed pairs, then the findings added and resolved.
func WriteDiffTable(w io.Writer, d *Diff) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	writeInput(row, d.Input)
	row(fmt.Sprintf("ACCESS CHANGES: %d added, %d removed, %d changed", len(d.Added), len(d.Removed), len(d.Changed)))
	if len(d.Added)+len(d.Removed)+len(d.Changed) > 0 {
		row("", "SOURCE", "DESTINATION", "PORT", "BEFORE", "AFTER")
		for _, p := range d.Added {
			row("+", p.Source, p.Destination, portText(p.Port), "-", routeText(p)+": "+allowedBy(p))
		}
		for _, p := range d.Removed {
			row("-", p.Source, p.Destination, portText(p.Port), routeText(p)+": "+allowedBy(p), "-")
		}
		for _, c := range d.Changed {
			row("~", c.After.Source, c.After.Destination, portText(c.After.Port), routeText(c.Before)+": "+allowedBy(c.Before), routeText(c.After)+": "+allowedBy(c.After))
		}
	}
	row("")
	writeFindings(row, "FINDINGS ADDED", d.FindingsAdded)
	row("")
	writeFindings(row, "FINDINGS RESOLVED", d.FindingsResolved)
	return tw.Flush()
}
