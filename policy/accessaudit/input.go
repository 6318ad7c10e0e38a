package accessaudit

import (
	"fmt"

	"github.com/relaymesh/relaymesh/policy/manifest"
)

// InputReport is what reading the files of an offline audit found
// (policy/manifest): the documents the API server would refuse, left out of
// the audit, and those skipped on purpose.
type InputReport struct {
	// Files, Documents and Objects count what was read (Objects: the
	// Relaymesh objects kept).
	Files     int                `json:"files"`
	Documents int                `json:"documents"`
	Objects   int                `json:"objects"`
	Problems  []manifest.Problem `json:"problems"`
	Notes     []manifest.Note    `json:"notes"`
}

// Severities lists the finding severities, most severe first.
var Severities = []string{SeverityHigh, SeverityMedium, SeverityLow, SeverityInfo}

// AtLeast says whether severity is threshold or more severe. An unknown
// severity is not.
func AtLeast(severity, threshold string) bool {
	s, ok := severityRank[severity]
	t, tok := severityRank[threshold]
	return ok && tok && s <= t
}

// writeInput writes the input section of a table.
func writeInput(row func(...string), r *InputReport) {
	if r == nil {
		return
	}
	row(fmt.Sprintf("INPUT: %s, %s, %s read; %s, %s",
		plural(r.Files, "file", "files"), plural(r.Documents, "document", "documents"), plural(r.Objects, "Relaymesh object", "Relaymesh objects"),
		plural(len(r.Problems), "problem (refused as the API server would, left out)", "problems (refused as the API server would, left out)"),
		plural(len(r.Notes), "note", "notes")))
	for _, p := range r.Problems {
		row("error", p.String())
	}
	for _, n := range r.Notes {
		row("note", n.String())
	}
	row("")
}
