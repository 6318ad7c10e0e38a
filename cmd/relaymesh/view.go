package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"

	"github.com/relaymesh/relaymesh/api/crds"
	"github.com/relaymesh/relaymesh/audit"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/policy/manifest"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A view is what describe and policy audit read: the translation input of
// a live installation or of files, and what decides which of its user
// objects are in force — the server's admission engine with the rule sets
// the view can read, the namespaces' labels, and, live, the statuses the
// server wrote (all.InForceConfig). Both commands, and the
// dashboard, decide "in force" with all.InForce.
type view struct {
	in      *translation.Input
	inForce all.InForceConfig
	// engine is inForce's Admission (to judge a what-if file the same way).
	engine *admission.Engine
	// input is what reading the files found (nil for a live view).
	input *accessaudit.InputReport
}

// Bounds on what a view reads; variables so tests can lower them.
var (
	auditMaxObjects = accessaudit.DefaultMaxObjects
	auditMaxBytes   = int64(manifest.DefaultMaxBytes)
)

// crdSchemas are the Relaymesh CRDs' validators, loaded on first use.
var crdSchemas = sync.OnceValues(func() (*manifest.Schemas, error) { return manifest.LoadSchemas(crds.FS) })

// newAdmission is the server's admission engine with its default rules;
// decisions are not recorded (a view decides nothing).
func newAdmission() (*admission.Engine, error) {
	return admission.New(admission.Config{Recorder: audit.Discard})
}

// loadView reads the view from paths (files, directories, "-" for stdin)
// when any is given, else from the management cluster (discovered objects
// from namespace, user objects from every namespace; Workloads from Redis
// when the installation keeps them there and store names it).
func loadView(ctx context.Context, d deps, g *globals, paths []string, namespace string, store snapshotStoreFlags) (*view, error) {
	if len(paths) > 0 && store.address != "" {
		return nil, usagef("-f reads the view from files; --redis-address reads a live installation's: give one of them")
	}
	if err := errors.Join(store.validate()...); err != nil {
		return nil, usageError{err}
	}
	engine, err := newAdmission()
	if err != nil {
		return nil, err
	}
	if len(paths) > 0 {
		return offlineView(ctx, d, engine, namespace, paths)
	}
	kube, err := g.clients()
	if err != nil {
		return nil, err
	}
	in, err := listInput(ctx, d, kube, namespace, store)
	if err != nil {
		return nil, err
	}
	v := &view{in: in, engine: engine, inForce: all.InForceConfig{AdminNamespace: namespace, Admission: engine, ServerStatus: true}}
	v.inForce.NamespaceLabels = liveNamespaceLabels(ctx, d.stderr, kube)
	liveRuleSets(ctx, d.stderr, kube, namespace, engine)
	return v, nil
}

// readFiles reads paths with the CRDs' validation.
func readFiles(ctx context.Context, d deps, namespace string, paths ...string) (*manifest.World, error) {
	schemas, err := crdSchemas()
	if err != nil {
		return nil, fmt.Errorf("the CRDs' schemas: %w", err)
	}
	return manifest.Read(ctx, manifest.Config{Schemas: schemas, AdminNamespace: namespace, MaxBytes: auditMaxBytes}, d.in(), paths...)
}

// offlineView reads the files of paths: the objects the API server would
// refuse are left out and reported, the rule set ConfigMaps loaded into
// engine (a rule set that does not pass its self-test is a problem: the
// server would not load it either).
func offlineView(ctx context.Context, d deps, engine *admission.Engine, namespace string, paths []string) (*view, error) {
	w, err := readFiles(ctx, d, namespace, paths...)
	if err != nil {
		return nil, fmt.Errorf("-f: %w", err)
	}
	report := inputReport(w)
	if len(w.RuleSets) > 0 {
		for _, st := range engine.Load(ctx, w.RuleSets) {
			if st.State == admission.StateRefused {
				report.Problems = append(report.Problems, manifest.Problem{Location: w.RuleSetAt[st.Name], Object: "ConfigMap " + st.Name,
					Message: "admission rule set refused, so it is not in force: " + st.Error})
			}
		}
	}
	return &view{in: w.Input, engine: engine, input: report,
		inForce: all.InForceConfig{AdminNamespace: namespace, Admission: engine, NamespaceLabels: w.NamespaceLabels}}, nil
}

func inputReport(w *manifest.World) *accessaudit.InputReport {
	r := &accessaudit.InputReport{Files: w.Files, Documents: w.Documents, Objects: w.Objects, Problems: w.Problems, Notes: w.Notes}
	if r.Problems == nil {
		r.Problems = []manifest.Problem{}
	}
	if r.Notes == nil {
		r.Notes = []manifest.Note{}
	}
	return r
}

// liveNamespaceLabels lists every Namespace's labels, which admission rules
// may read. Without permission the rules see none, and the note says so
// (the statuses the server wrote still count).
func liveNamespaceLabels(ctx context.Context, stderr io.Writer, kube *kubeclient.Clients) map[string]map[string]string {
	list, err := kube.Typed.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(stderr, "note: the namespaces' labels cannot be read (%s): admission rules that read them judge with none; the statuses the server wrote still count\n", reason(err))
		return nil
	}
	out := make(map[string]map[string]string, len(list.Items))
	for _, ns := range list.Items {
		out[ns.Name] = ns.Labels
	}
	return out
}

// liveRuleSets loads the installation's rule set ConfigMaps into engine,
// as the server's Loader does.
func liveRuleSets(ctx context.Context, stderr io.Writer, kube *kubeclient.Clients, namespace string, engine *admission.Engine) {
	list, err := kube.Typed.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: admission.PolicyLabel})
	if err != nil {
		fmt.Fprintf(stderr, "note: the admission rule sets in %s cannot be read (%s): only the default rules are applied here; the statuses the server wrote still count\n", namespace, reason(err))
		return
	}
	var sets []admission.RuleSet
	for i := range list.Items {
		sets = append(sets, admission.RuleSetOf(&list.Items[i]))
	}
	for _, st := range engine.Load(ctx, sets) {
		if st.State == admission.StateRefused {
			fmt.Fprintf(stderr, "note: admission rule set %s does not pass its self-test here (%s); the server keeps its last accepted version, which only its statuses show\n", st.Name, st.Error)
		}
	}
}

func reason(err error) string {
	if apierrors.IsForbidden(err) {
		return "forbidden"
	}
	return err.Error()
}

// in is the commands' standard input.
func (d deps) in() io.Reader {
	if d.stdin != nil {
		return d.stdin
	}
	return os.Stdin
}

// printInput writes a view's problems and notes to w as lines, for the
// commands whose output has no place for them.
func printInput(w io.Writer, r *accessaudit.InputReport) {
	if r == nil {
		return
	}
	for _, p := range r.Problems {
		fmt.Fprintln(w, "error:", p)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
}

// hasStdin says whether paths read standard input.
func hasStdin(paths []string) bool { return slices.Contains(paths, manifest.Stdin) }
