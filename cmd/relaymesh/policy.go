package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

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
match nothing or are not in force; destinations reachable from outside their
VirtualMesh; identities Istio cannot tell apart; TrafficPolicy conflicts.

What-if: --with FILE adds the objects of a YAML file (an object of the same
kind, namespace and name replaces the current one) and --without
KIND/NAMESPACE/NAME (repeatable) removes one; the output is then the
difference in access: pairs added, removed and changed, findings added and
resolved.

The view is read from the management cluster (discovered objects from
--namespace, user objects from every namespace), or with -f from the YAML
files of a directory. Output: table, json (schema ` + accessaudit.Schema + `)
or html (one self-contained page with the matrix as a picture).`

// Bounds on what policy audit reads; variables so tests can lower them.
var (
	auditMaxObjects = accessaudit.DefaultMaxObjects
	auditMaxBytes   = int64(64 << 20)
)

func newPolicyCommand(d deps, g *globals) *cobra.Command {
	var dir, with, output, outPath string
	var store snapshotStoreFlags
	var without []string
	audit := &cobra.Command{
		Use:   "audit",
		Short: "Audit who can reach what: the access matrix and findings",
		Long:  policyAuditSynopsis,
		Example: `  # The live access matrix of the management cluster
  relaymesh policy audit --context mgmt

  # What would change if a policy were removed, as JSON
  relaymesh policy audit --without accesspolicy/bookinfo/reviews-from-productpage -o json

  # Offline, from YAML files, as one HTML page
  relaymesh policy audit -f ./world -o html --out access.html`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runPolicyAudit(c.Context(), d, g, dir, with, output, outPath, without, store)
		},
	}
	fs := audit.Flags()
	fs.StringVarP(&dir, "filename", "f", "", "read the view from the .yaml/.yml/.json files of this directory instead of a cluster")
	fs.StringVar(&with, "with", "", "what-if: add (or replace) the objects of this YAML file and print the difference in access")
	fs.StringArrayVar(&without, "without", nil, "what-if: remove the object KIND/NAMESPACE/NAME (repeatable), e.g. accesspolicy/bookinfo/reviews-from-productpage")
	outputFlag(audit, &output, printer.Formats, "html")
	fs.StringVar(&outPath, "out", "", "write the output to this file (mode 0600) instead of stdout")
	store.registerRead(fs)
	return groupCommand("policy", "Audit access policies", "Audit who can reach what through the AccessPolicies and VirtualMeshes in force.",
		"  relaymesh policy audit --context mgmt", audit)
}

func runPolicyAudit(ctx context.Context, d deps, g *globals, dir, with, format, outPath string, without []string, store snapshotStoreFlags) error {
	namespace, stdout := g.namespace, d.stdout
	switch format {
	case "table", "wide", "json", "yaml", "html":
	default:
		return usagef("-o %q: want table, wide, json, yaml or html", format)
	}
	var refs []accessaudit.Ref
	for _, w := range without {
		r, err := accessaudit.ParseRef(w)
		if err != nil {
			return usagef("--without %w", err)
		}
		refs = append(refs, r)
	}
	var change *translation.Input
	if with != "" {
		var err error
		if change, err = readChange(with); err != nil {
			return err
		}
	}

	if dir != "" {
		if err := checkDirSize(dir); err != nil {
			return err
		}
	}
	in, err := loadView(ctx, d, dir, g, namespace, store)
	if err != nil {
		return err
	}
	cfg := accessaudit.Config{AdminNamespace: namespace, MaxObjects: auditMaxObjects}
	before, err := accessaudit.Audit(in, cfg)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if change == nil && len(refs) == 0 {
		err = writeResult(&buf, format, before)
	} else {
		err = writeWhatIf(&buf, format, cfg, in, before, change, refs)
	}
	if err != nil {
		return err
	}
	if outPath != "" {
		return os.WriteFile(outPath, buf.Bytes(), 0o600)
	}
	_, err = stdout.Write(buf.Bytes())
	return err
}

// readChange reads a what-if file strictly, like -f.
func readChange(path string) (*translation.Input, error) {
	f, err := os.Open(filepath.Clean(path))
	if err != nil {
		return nil, fmt.Errorf("--with: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, auditMaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--with: %w", err)
	}
	if int64(len(b)) > auditMaxBytes {
		return nil, fmt.Errorf("--with: %s is larger than %d bytes", path, auditMaxBytes)
	}
	in := &translation.Input{}
	if err := in.Decode(b); err != nil {
		return nil, fmt.Errorf("--with: %s: %w", path, err)
	}
	if accessaudit.Count(in) == 0 {
		return nil, fmt.Errorf("--with: %s has no objects", path)
	}
	return in, nil
}

// checkDirSize refuses a -f directory whose input files add up to more than
// auditMaxBytes, before anything is read.
func checkDirSize(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil // loadInputDir reports it
	}
	var total int64
	for _, e := range entries {
		if e.IsDir() || !slices.Contains([]string{".yaml", ".yml", ".json"}, filepath.Ext(e.Name())) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		total += info.Size()
	}
	if total > auditMaxBytes {
		return fmt.Errorf("-f: the files of %s add up to %d bytes, more than the %d audited", dir, total, auditMaxBytes)
	}
	return nil
}

// writeWhatIf audits in changed by change and refs, and writes the
// difference from before.
func writeWhatIf(w io.Writer, format string, cfg accessaudit.Config, in *translation.Input, before *accessaudit.Result, change *translation.Input, refs []accessaudit.Ref) error {
	proposed, err := accessaudit.WhatIf(in, change, refs)
	if err != nil {
		return err
	}
	after, err := accessaudit.Audit(proposed, cfg)
	if err != nil {
		return fmt.Errorf("with the change: %w", err)
	}
	return writeDiff(w, format, accessaudit.Compare(before, after))
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
