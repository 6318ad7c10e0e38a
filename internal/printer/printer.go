// Package printer writes what the relaymesh commands print in the formats
// kubectl users expect (-o table|wide|json|yaml): an aligned table, the
// same table with more columns, or the object as JSON or YAML for scripts.
package printer

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Format is an output format.
type Format string

// The formats.
const (
	Table Format = "table"
	Wide  Format = "wide"
	JSON  Format = "json"
	YAML  Format = "yaml"
)

// Formats are the formats every command that prints objects accepts.
var Formats = []Format{Table, Wide, JSON, YAML}

// Names returns the names of formats, for help texts and completion.
func Names(formats []Format) []string {
	out := make([]string, len(formats))
	for i, f := range formats {
		out[i] = string(f)
	}
	return out
}

// Parse checks s against the allowed formats.
func Parse(s string, allowed []Format) (Format, error) {
	f := Format(strings.ToLower(strings.TrimSpace(s)))
	if !slices.Contains(allowed, f) {
		return "", fmt.Errorf("-o %q: want %s", s, strings.Join(Names(allowed), ", "))
	}
	return f, nil
}

// Tabular is a value that can print itself as a table.
type Tabular interface {
	// Columns are the headers; wide adds the columns of -o wide.
	Columns(wide bool) []string
	// Rows are the cells, as many per row as Columns.
	Rows(wide bool) [][]string
}

// Print writes v in format f: a table for Table and Wide (v must be
// Tabular), else v marshalled as JSON or YAML.
func Print(w io.Writer, f Format, v any) error {
	switch f {
	case JSON:
		return WriteJSON(w, v)
	case YAML:
		return WriteYAML(w, v)
	case Table, Wide:
		t, ok := v.(Tabular)
		if !ok {
			return fmt.Errorf("%T cannot be printed as a table", v)
		}
		return WriteTable(w, t.Columns(f == Wide), t.Rows(f == Wide))
	}
	return fmt.Errorf("unknown output format %q", f)
}

// WriteJSON writes v as indented JSON and a newline.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteYAML writes v as YAML (through its JSON form, so json tags apply).
func WriteYAML(w io.Writer, v any) error {
	b, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// WriteTable writes an aligned table with a header row. Cells are single
// lines: line breaks and tabs in a cell become spaces.
func WriteTable(w io.Writer, columns []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	clean := strings.NewReplacer("\t", " ", "\n", " ", "\r", " ")
	line := func(cells []string) {
		out := make([]string, len(cells))
		for i, c := range cells {
			if c == "" {
				c = "-"
			}
			out[i] = clean.Replace(c)
		}
		fmt.Fprintln(tw, strings.Join(out, "\t"))
	}
	line(columns)
	for _, r := range rows {
		line(r)
	}
	return tw.Flush()
}
