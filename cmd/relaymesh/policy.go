package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"
)

const policyAuditSynopsis = `Audit who can reach what. Translate the current view once, the way the
server does, and print the effective access matrix (every source identity —
cluster, namespace, service account — and destination port that is allowed,
with the AccessPolicies that allow it and their path/method conditions) and
the findings: policies that allow everyone, are shadowed by broader ones,
match nothing, are refused by admission or otherwise not in force;
destinations reachable from outside their VirtualMesh; identities Istio
cannot tell apart; TrafficPolicy conflicts; AccessPolicies with paths or
methods at ambient Destinations no usable waypoint serves (they allow no
one there, and the matrix leaves those pairs out).

Only what is in force counts, decided as the server decides it: every user
object passes the server's admission rules (the built-in ones, and the rule
set ConfigMaps the view holds), policies outside the server's namespace
reach only their own, and, live, an object the server reports Invalid for
its current generation is left out too. A refused object allows nothing
and restricts nothing.

The view is read from the management cluster (discovered objects from
--namespace, user objects from every namespace), or with -f from files:
-f takes files, directories (read recursively: every .yaml, .yml and .json
file; directories whose name starts with a dot are skipped) and - (standard
input), and may be repeated. Files hold YAML documents or JSON objects,
Lists included (kubectl get -o yaml). Every Relaymesh object is checked as
the API server would check it (its CRD's OpenAPI schema and CEL rules,
unknown fields, a wrong apiVersion); one that fails is reported with the
field and the API server's message, and left out. Namespaces give their
labels and ConfigMaps labelled relaymesh.io/admission-policy in --namespace
their rule sets, as on the server; other kinds are skipped with a note.
'relaymesh policy export' writes a live installation's view as such a file.

What-if: --with FILE adds the objects of a YAML file (an object of the same
kind, namespace and name replaces the current one; checked like -f) and
--without KIND/NAMESPACE/NAME (repeatable) removes one; the output is then
the difference in access: pairs added, removed and changed, findings added
and resolved.

Output: table, wide, json or yaml (schema ` + accessaudit.Schema + `; with -f or
--with it holds an input section: the files' problems and notes), or html
(one self-contained page with the matrix as a picture).

Exit code, for CI (with --with: of the findings the change adds):
  0  the input is valid and no finding is at least --fail-on
  1  findings at least --fail-on (default medium): warnings
  2  errors: an object the API server or its admission would refuse (files
     only; live, such an object is a high finding), malformed input, a bad
     flag, or the audit could not run`

// noFailOn is --fail-on's value for "findings never fail".
const noFailOn = "none"

// Exit codes of policy audit (see its help): exitOK, exitFindings,
// exitInvalid.
const (
	exitFindings = 1
	exitInvalid  = 2
)

// auditFlags are policy audit's flags.
type auditFlags struct {
	files        []string
	with, format string
	outPath      string
	failOn       string
	without      []string
	store        snapshotStoreFlags
}

func newPolicyCommand(d deps, g *globals) *cobra.Command {
	var f auditFlags
	audit := &cobra.Command{
		Use:   "audit",
		Short: "Audit who can reach what: the access matrix and findings",
		Long:  policyAuditSynopsis,
		Example: `  # The live access matrix of the management cluster
  relaymesh policy audit --context mgmt

  # What would change if a policy were removed, as JSON
  relaymesh policy audit --without accesspolicy/bookinfo/reviews-from-productpage -o json

  # A CI gate on a GitOps repository (exit 2: invalid, 1: findings)
  relaymesh policy audit -f clusters/mgmt/ -f world.yaml --fail-on high

  # From standard input, as one HTML page
  kubectl get accesspolicies -A -o yaml | relaymesh policy audit -f world.yaml -f - -o html --out access.html`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			code, err := runPolicyAudit(c.Context(), d, g, f)
			if err != nil {
				var u usageError
				if errors.As(err, &u) {
					return err // exit 2, with the pointer to --help
				}
				fmt.Fprintf(d.stderr, "%s: %v\n", c.CommandPath(), err)
				return exitCodeError{exitInvalid}
			}
			if code != exitOK {
				return exitCodeError{code}
			}
			return nil
		},
	}
	fs := audit.Flags()
	fs.StringArrayVarP(&f.files, "filename", "f", nil, "read the view from these files, directories (recursive) or - (stdin) instead of a cluster (repeatable)")
	fs.StringVar(&f.with, "with", "", "what-if: add (or replace) the objects of this YAML file and print the difference in access")
	fs.StringArrayVar(&f.without, "without", nil, "what-if: remove the object KIND/NAMESPACE/NAME (repeatable), e.g. accesspolicy/bookinfo/reviews-from-productpage")
	fs.StringVar(&f.failOn, "fail-on", accessaudit.SeverityMedium, "exit 1 when a finding is at least this severe: "+strings.Join(append(accessaudit.Severities, noFailOn), ", "))
	outputFlag(audit, &f.format, printer.Formats, "html")
	fs.StringVar(&f.outPath, "out", "", "write the output to this file (mode 0600) instead of stdout")
	f.store.registerRead(fs)
	return groupCommand("policy", "Audit access policies", "Audit who can reach what through the AccessPolicies and VirtualMeshes in force, and export a live view for audits offline.",
		"  relaymesh policy audit --context mgmt\n  relaymesh policy export --context mgmt --out world.yaml", audit, newPolicyExportCommand(d, g))
}

// runPolicyAudit audits and writes the result; it returns the exit code
// (exitOK, 1 for findings, 2 for invalid input) or an error.
func runPolicyAudit(ctx context.Context, d deps, g *globals, f auditFlags) (int, error) {
	namespace := g.namespace
	switch f.format {
	case "table", "wide", "json", "yaml", "html":
	default:
		return 0, usagef("-o %q: want table, wide, json, yaml or html", f.format)
	}
	if f.failOn != noFailOn && !accessaudit.AtLeast(f.failOn, accessaudit.SeverityInfo) {
		return 0, usagef("--fail-on %q: want %s", f.failOn, strings.Join(append(accessaudit.Severities, noFailOn), ", "))
	}
	var refs []accessaudit.Ref
	for _, w := range f.without {
		r, err := accessaudit.ParseRef(w)
		if err != nil {
			return 0, usagef("--without %w", err)
		}
		refs = append(refs, r)
	}
	if f.with == "-" && hasStdin(f.files) {
		return 0, usagef("--with - and -f - both read standard input: give one of them")
	}

	v, err := loadView(ctx, d, g, f.files, namespace, f.store)
	if err != nil {
		return 0, err
	}
	cfg := accessaudit.Config{AdminNamespace: namespace, Admission: v.engine, NamespaceLabels: v.inForce.NamespaceLabels,
		ServerStatus: v.inForce.ServerStatus, MaxObjects: auditMaxObjects}
	before, err := accessaudit.Audit(ctx, v.in, cfg)
	if err != nil {
		return 0, err
	}
	offline := len(f.files) > 0
	var buf bytes.Buffer
	var code int
	if f.with == "" && len(refs) == 0 {
		before.Input = v.input
		err = writeResult(&buf, f.format, before)
		code = auditExitCode(v.input, before.Findings, offline, f.failOn)
	} else {
		var diff *accessaudit.Diff
		diff, err = whatIf(ctx, d, namespace, cfg, v, before, f.with, refs)
		if err == nil {
			err = writeDiff(&buf, f.format, diff)
			// The change's objects come from a file: a refusal is invalid
			// input, wherever the view came from.
			code = auditExitCode(diff.Input, diff.FindingsAdded, true, f.failOn)
		}
	}
	if err != nil {
		return 0, err
	}
	if f.outPath != "" {
		err = os.WriteFile(f.outPath, buf.Bytes(), 0o600)
	} else {
		_, err = d.stdout.Write(buf.Bytes())
	}
	if err != nil {
		return 0, err
	}
	if code == exitInvalid {
		fmt.Fprintln(d.stderr, "relaymesh policy audit: invalid input: the input section lists what the API server would refuse, the refused-by-admission findings what its admission would")
	}
	return code, nil
}

// auditExitCode is the documented exit code: 2 when the input has problems
// or (read from files) holds an object admission refuses, 1 when a finding
// is at least failOn, else 0.
func auditExitCode(input *accessaudit.InputReport, findings []accessaudit.Finding, fromFiles bool, failOn string) int {
	if input != nil && len(input.Problems) > 0 {
		return exitInvalid
	}
	code := exitOK
	for _, f := range findings {
		if fromFiles && f.Kind == accessaudit.KindRefused {
			return exitInvalid
		}
		if failOn != noFailOn && accessaudit.AtLeast(f.Severity, failOn) {
			code = exitFindings
		}
	}
	return code
}

// whatIf audits the view changed by the objects of the file with (checked
// like -f) and without refs, and returns the difference from before.
func whatIf(ctx context.Context, d deps, namespace string, cfg accessaudit.Config, v *view, before *accessaudit.Result, with string, refs []accessaudit.Ref) (*accessaudit.Diff, error) {
	var change *translation.Input
	input := v.input
	if with != "" {
		w, err := readFiles(ctx, d, namespace, with)
		if err != nil {
			return nil, fmt.Errorf("--with: %w", err)
		}
		if accessaudit.Count(w.Input) == 0 && len(w.Problems) == 0 {
			return nil, fmt.Errorf("--with: %s has no Relaymesh objects", with)
		}
		change = w.Input
		input = mergeInput(input, inputReport(w))
		if len(w.NamespaceLabels) > 0 {
			labels := maps.Clone(cfg.NamespaceLabels)
			if labels == nil {
				labels = map[string]map[string]string{}
			}
			maps.Copy(labels, w.NamespaceLabels)
			cfg.NamespaceLabels = labels
		}
	}
	proposed, err := accessaudit.WhatIf(v.in, change, refs)
	if err != nil {
		return nil, err
	}
	after, err := accessaudit.Audit(ctx, proposed, cfg)
	if err != nil {
		return nil, fmt.Errorf("with the change: %w", err)
	}
	diff := accessaudit.Compare(before, after)
	diff.Input = input
	return diff, nil
}

// mergeInput adds b's counts, problems and notes to a's (either may be nil).
func mergeInput(a, b *accessaudit.InputReport) *accessaudit.InputReport {
	if a == nil {
		return b
	}
	out := *a
	out.Files += b.Files
	out.Documents += b.Documents
	out.Objects += b.Objects
	out.Problems = slices.Concat(a.Problems, b.Problems)
	out.Notes = slices.Concat(a.Notes, b.Notes)
	return &out
}

func writeResult(w io.Writer, format string, r *accessaudit.Result) error {
	switch format {
	case "json":
		return accessaudit.WriteJSON(w, r)
	case "yaml":
		return jsonAsYAML(w, func(w io.Writer) error { return accessaudit.WriteJSON(w, r) })
	case "html":
		return accessaudit.WriteHTML(w, r)
	}
	return accessaudit.WriteTable(w, r)
}

func writeDiff(w io.Writer, format string, d *accessaudit.Diff) error {
	switch format {
	case "json":
		return accessaudit.WriteJSON(w, d)
	case "yaml":
		return jsonAsYAML(w, func(w io.Writer) error { return accessaudit.WriteJSON(w, d) })
	case "html":
		return accessaudit.WriteDiffHTML(w, d)
	}
	return accessaudit.WriteDiffTable(w, d)
}

// jsonAsYAML writes what write writes as JSON, converted to YAML.
func jsonAsYAML(w io.Writer, write func(io.Writer) error) error {
	var buf bytes.Buffer
	if err := write(&buf); err != nil {
		return err
	}
	y, err := yaml.JSONToYAML(buf.Bytes())
	if err != nil {
		return err
	}
	_, err = w.Write(y)
	return err
}
