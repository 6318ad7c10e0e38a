package manifest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/translation"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Bounds of Config.
const (
	DefaultMaxBytes     = 64 << 20
	DefaultMaxDocuments = 100_000
	DefaultMaxFiles     = 10_000
)

// Stdin is the path that reads standard input.
const Stdin = "-"

// ErrTooLarge means the input is beyond one of Config's bounds.
var ErrTooLarge = errors.New("input too large")

// Config configures Read.
type Config struct {
	// Schemas validate the Relaymesh objects (LoadSchemas(crds.FS)).
	// Required.
	Schemas *Schemas
	// AdminNamespace is the server's namespace: only ConfigMaps there are
	// admission rule sets. Required.
	AdminNamespace string
	// MaxBytes bounds the bytes read from all paths; 0: DefaultMaxBytes.
	MaxBytes int64
	// MaxDocuments bounds the documents and List items; 0:
	// DefaultMaxDocuments.
	MaxDocuments int
	// MaxFiles bounds the files read; 0: DefaultMaxFiles.
	MaxFiles int
}

// Validate reports every problem with c, each prefixed with its field path.
func (c Config) Validate() error {
	var errs []error
	if c.Schemas == nil {
		errs = append(errs, errors.New("schemas: required"))
	}
	if c.AdminNamespace == "" {
		errs = append(errs, errors.New("adminNamespace: required"))
	}
	if c.MaxBytes < 0 || c.MaxDocuments < 0 || c.MaxFiles < 0 {
		errs = append(errs, errors.New("maxBytes, maxDocuments, maxFiles: must not be negative"))
	}
	return errors.Join(errs...)
}

// Location is where a document was read.
type Location struct {
	// Source is the file's path, or "-" for standard input.
	Source string `json:"source"`
	// Document is the document's place in the file, from 1.
	Document int `json:"document"`
	// Item is the object's place in a List document, from 1; 0 when the
	// document is not a List.
	Item int `json:"item,omitempty"`
}

func (l Location) String() string {
	s := fmt.Sprintf("%s: document %d", l.Source, l.Document)
	if l.Item > 0 {
		s += fmt.Sprintf(" item %d", l.Item)
	}
	return s
}

// Problem is a document the API server (or kubectl) would refuse.
type Problem struct {
	Location
	// Object is "Kind namespace/name" when known.
	Object string `json:"object,omitempty"`
	// Field is the path of the offending field when known, e.g.
	// spec.globalAccessPolicy.
	Field string `json:"field,omitempty"`
	// Message is the API server's message.
	Message string `json:"message"`
}

func (p Problem) String() string {
	parts := []string{p.Location.String()}
	if p.Object != "" {
		parts = append(parts, p.Object)
	}
	if p.Field != "" {
		parts = append(parts, p.Field)
	}
	return strings.Join(append(parts, p.Message), ": ")
}

// Note is a document skipped on purpose.
type Note struct {
	Location
	Message string `json:"message"`
}

func (n Note) String() string { return n.Location.String() + ": " + n.Message }

// World is what a set of files makes: the translation input, what
// admission reads besides it, and what was refused or skipped.
type World struct {
	Input *translation.Input
	// NamespaceLabels are the labels of the Namespaces read, by name.
	NamespaceLabels map[string]map[string]string
	// RuleSets are the admission rule sets of the ConfigMaps read, by name;
	// RuleSetAt says where each was read.
	RuleSets  []admission.RuleSet
	RuleSetAt map[string]Location
	Problems  []Problem
	Notes     []Note
	// Files, Documents and Objects count what was read (Objects: the
	// Relaymesh objects kept).
	Files, Documents, Objects int
}

// Document is one object as read.
type Document struct {
	Location
	Object map[string]any
}

// Split decodes a stream of YAML documents or JSON objects, expanding List
// documents into their items. It returns at most max documents (0: no
// bound) and a Problem for each document it cannot read; after a syntax
// error the rest of the stream is not read. Empty documents are skipped.
func Split(b []byte, source string, max int) ([]Document, []Problem, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var docs []Document
	var problems []Problem
	add := func(d Document) error {
		if max > 0 && len(docs) >= max {
			return fmt.Errorf("%w: %s holds more than %d documents and List items", ErrTooLarge, source, max)
		}
		docs = append(docs, d)
		return nil
	}
	for n := 1; ; n++ {
		var raw any
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return docs, problems, nil
		}
		at := Location{Source: source, Document: n}
		if err != nil {
			problems = append(problems, Problem{Location: at, Message: "not valid YAML or JSON: " + err.Error()})
			return docs, problems, nil
		}
		if raw == nil {
			continue
		}
		obj, ok := raw.(map[string]any)
		if !ok {
			problems = append(problems, Problem{Location: at, Message: fmt.Sprintf("a document must be an object, not %s", typeName(raw))})
			continue
		}
		if len(obj) == 0 {
			continue
		}
		items, isList := listItems(obj)
		if !isList {
			if err := add(Document{Location: at, Object: obj}); err != nil {
				return nil, nil, err
			}
			continue
		}
		for i, item := range items {
			at := Location{Source: source, Document: n, Item: i + 1}
			m, ok := item.(map[string]any)
			if !ok {
				problems = append(problems, Problem{Location: at, Message: fmt.Sprintf("a List item must be an object, not %s", typeName(item))})
				continue
			}
			if _, nested := listItems(m); nested {
				problems = append(problems, Problem{Location: at, Message: "a List inside a List is not read"})
				continue
			}
			if err := add(Document{Location: at, Object: m}); err != nil {
				return nil, nil, err
			}
		}
	}
}

// listItems returns the items of a List document (kind List, or a kind
// ending in List with an items list, as client-go's typed lists).
func listItems(obj map[string]any) ([]any, bool) {
	kind, _ := obj["kind"].(string)
	if kind != "List" && !(strings.HasSuffix(kind, "List") && obj["items"] != nil) {
		return nil, false
	}
	items, _ := obj["items"].([]any)
	return items, true
}

func typeName(v any) string {
	switch v.(type) {
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	}
	return "a number"
}

// Read reads paths (files, directories, or Stdin read from stdin) and
// checks every document. Problems with the documents are in the World; the
// error is for what stops reading: a path that cannot be read, a directory
// without input files, a bound passed (ErrTooLarge).
func Read(ctx context.Context, cfg Config, stdin io.Reader, paths ...string) (*World, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("manifest config: %w", err)
	}
	if len(paths) == 0 {
		return nil, errors.New("no path to read")
	}
	r := &reader{cfg: cfg, budget: cmp.Or(cfg.MaxBytes, DefaultMaxBytes), docs: cmp.Or(cfg.MaxDocuments, DefaultMaxDocuments),
		files: cmp.Or(cfg.MaxFiles, DefaultMaxFiles), seen: map[string]Location{}, skipped: map[string]*skipped{},
		w: &World{Input: &translation.Input{}, NamespaceLabels: map[string]map[string]string{}, RuleSetAt: map[string]Location{}}}
	stdinRead := false
	for _, p := range paths {
		if p == Stdin {
			if stdinRead {
				return nil, errors.New("standard input (-) named twice")
			}
			stdinRead = true
			if err := r.readFrom(ctx, Stdin, stdin); err != nil {
				return nil, err
			}
			continue
		}
		if err := r.readPath(ctx, p); err != nil {
			return nil, err
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.skipped)) {
		s := r.skipped[k]
		msg := s.what + ": skipped, not read by the audit"
		if s.n > 1 {
			msg = fmt.Sprintf("%s: %d skipped (the first here), not read by the audit", s.what, s.n)
		}
		r.w.Notes = append(r.w.Notes, Note{Location: s.first, Message: msg})
	}
	slices.SortStableFunc(r.w.Notes, func(a, b Note) int { return compareLocations(a.Location, b.Location) })
	for _, name := range slices.Sorted(maps.Keys(r.ruleSets)) {
		r.w.RuleSets = append(r.w.RuleSets, r.ruleSets[name])
	}
	return r.w, nil
}

func compareLocations(a, b Location) int {
	return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.Document, b.Document), cmp.Compare(a.Item, b.Item))
}

type reader struct {
	cfg      Config
	w        *World
	budget   int64
	docs     int
	files    int
	seen     map[string]Location // kind/namespace/name → where first defined
	skipped  map[string]*skipped // by what
	ruleSets map[string]admission.RuleSet
}

type skipped struct {
	what  string
	first Location
	n     int
}

// inputExts are the file name extensions read from a directory.
var inputExts = []string{".yaml", ".yml", ".json"}

func (r *reader) readPath(ctx context.Context, p string) error {
	info, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return r.readFile(ctx, p)
	}
	found := 0
	err = filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != p && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		if !slices.Contains(inputExts, strings.ToLower(filepath.Ext(path))) || !d.Type().IsRegular() {
			return nil
		}
		found++
		return r.readFile(ctx, path)
	})
	if err != nil {
		return err
	}
	if found == 0 {
		return fmt.Errorf("%s has no .yaml, .yml or .json files", p)
	}
	return nil
}

func (r *reader) readFile(ctx context.Context, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return r.readFrom(ctx, p, f)
}

// readFrom reads one source within the byte, file and document bounds.
func (r *reader) readFrom(ctx context.Context, source string, in io.Reader) error {
	if r.w.Files++; r.w.Files > r.files {
		return fmt.Errorf("%w: more than %d files", ErrTooLarge, r.files)
	}
	b, err := io.ReadAll(io.LimitReader(in, r.budget+1))
	if err != nil {
		return fmt.Errorf("%s: %w", source, err)
	}
	if int64(len(b)) > r.budget {
		return fmt.Errorf("%w: the files add up to more than %d bytes (at %s)", ErrTooLarge, cmp.Or(r.cfg.MaxBytes, DefaultMaxBytes), source)
	}
	r.budget -= int64(len(b))
	docs, problems, err := Split(b, source, r.docs)
	if err != nil {
		return err
	}
	r.docs -= len(docs)
	r.w.Documents += len(docs)
	r.w.Problems = append(r.w.Problems, problems...)
	for _, d := range docs {
		if err := ctx.Err(); err != nil {
			return err
		}
		r.document(ctx, d)
	}
	return nil
}

func (r *reader) problem(at Location, object, fieldPath, format string, args ...any) {
	r.w.Problems = append(r.w.Problems, Problem{Location: at, Object: object, Field: fieldPath, Message: fmt.Sprintf(format, args...)})
}

func (r *reader) skip(at Location, what string) {
	s := r.skipped[what]
	if s == nil {
		s = &skipped{what: what, first: at}
		r.skipped[what] = s
	}
	s.n++
}

// document classifies and checks one document.
func (r *reader) document(ctx context.Context, d Document) {
	u := &unstructured.Unstructured{Object: d.Object}
	apiVersion, okV := d.Object["apiVersion"].(string)
	kind, okK := d.Object["kind"].(string)
	if (d.Object["apiVersion"] != nil && !okV) || (d.Object["kind"] != nil && !okK) {
		r.problem(d.Location, "", "", "apiVersion and kind must be strings")
		return
	}
	switch {
	case apiVersion == "" && kind == "":
		r.skip(d.Location, "documents without apiVersion and kind (not Kubernetes objects)")
		return
	case apiVersion == "":
		r.problem(d.Location, kind, "apiVersion", "Required value: a %s needs an apiVersion", kind)
		return
	case kind == "":
		r.problem(d.Location, "", "kind", "Required value: an object of %s needs a kind", apiVersion)
		return
	}
	if msg := metadataProblem(d.Object); msg != "" {
		r.problem(d.Location, kind, "metadata", "%s", msg)
		return
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		r.problem(d.Location, kind, "apiVersion", "%v", err)
		return
	}
	object := kind + " " + objectName(u)
	crd, err := r.cfg.Schemas.expected(gv, kind)
	if err != nil {
		r.problem(d.Location, object, "apiVersion", "%v", err)
		return
	}
	if crd == nil {
		r.foreign(d, gv, kind, u)
		return
	}
	if crd.namespaced && u.GetNamespace() == "" {
		u.SetNamespace("default") // kubectl's namespace when none is given
	}
	object = kind + " " + objectName(u)
	unknown, errs := crd.admit(ctx, u)
	for _, f := range unknown {
		r.problem(d.Location, object, f, "unknown field %q", f)
	}
	for _, e := range errs {
		if e.Detail == celNotChecked {
			r.problem(d.Location, object, "", "%s", celNotChecked)
			continue
		}
		r.problem(d.Location, object, e.Field, "%s", e.ErrorBody())
	}
	if len(unknown)+len(errs) > 0 {
		return // the API server would refuse it
	}
	key := crd.gvk.GroupKind().String() + "/" + u.GetNamespace() + "/" + u.GetName()
	if first, dup := r.seen[key]; dup {
		r.problem(d.Location, object, "metadata.name", "defined twice: first at %s", first)
		return
	}
	r.seen[key] = d.Location
	switch err := r.keep(u); {
	case errors.Is(err, errNotRead):
		r.skip(d.Location, apiVersion+" "+kind+" (valid)")
	case err != nil:
		r.problem(d.Location, object, "", "%v", err)
	default:
		r.w.Objects++
	}
}

// metadataProblem says what is wrong with the shape of an object's
// metadata: an object, whose name and namespace are strings (YAML reads an
// unquoted y, no or on as a boolean).
func metadataProblem(obj map[string]any) string {
	raw, ok := obj["metadata"]
	if !ok || raw == nil {
		return ""
	}
	meta, ok := raw.(map[string]any)
	if !ok {
		return fmt.Sprintf("must be an object, not %s", typeName(raw))
	}
	for _, k := range []string{"name", "namespace", "generateName"} {
		if v, ok := meta[k]; ok && v != nil {
			if _, isString := v.(string); !isString {
				return fmt.Sprintf("%s must be a string, not %s (quote it: YAML reads unquoted y, n, yes, no, on, off as booleans)", k, typeName(v))
			}
		}
	}
	return ""
}

func objectName(u *unstructured.Unstructured) string {
	if u.GetNamespace() == "" {
		return u.GetName()
	}
	return u.GetNamespace() + "/" + u.GetName()
}

// keep adds a validated Relaymesh object to the input.
func (r *reader) keep(u *unstructured.Unstructured) error {
	in := r.w.Input
	var err error
	switch u.GetKind() {
	case "Mesh":
		in.Meshes, err = appendAs[discoveryv1alpha1.Mesh](in.Meshes, u)
	case "Workload":
		in.Workloads, err = appendAs[discoveryv1alpha1.Workload](in.Workloads, u)
	case "Destination":
		in.Destinations, err = appendAs[discoveryv1alpha1.Destination](in.Destinations, u)
	case translation.KindVirtualMesh:
		in.VirtualMeshes, err = appendAs[networkingv1alpha1.VirtualMesh](in.VirtualMeshes, u)
	case translation.KindTrafficPolicy:
		in.TrafficPolicies, err = appendAs[networkingv1alpha1.TrafficPolicy](in.TrafficPolicies, u)
	case translation.KindAccessPolicy:
		in.AccessPolicies, err = appendAs[networkingv1alpha1.AccessPolicy](in.AccessPolicies, u)
	case translation.KindVirtualDestination:
		in.VirtualDestinations, err = appendAs[networkingv1alpha1.VirtualDestination](in.VirtualDestinations, u)
	case "KubernetesCluster":
		// The registry: which trust domains each cluster's meshes may use
		// (issue 27). Without it no mesh is federated, as on the server.
		in.Clusters, err = appendAs[multiclusterv1alpha1.KubernetesCluster](in.Clusters, u)
	default:
		return errNotRead
	}
	return err
}

// errNotRead marks a valid Relaymesh object that no view reads.
var errNotRead = errors.New("not read")

func appendAs[T any](xs []T, u *unstructured.Unstructured) ([]T, error) {
	var t T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &t); err != nil {
		return xs, err
	}
	return append(xs, t), nil
}

// foreign handles a document of another API: Namespaces and rule set
// ConfigMaps are read, the rest skipped.
func (r *reader) foreign(d Document, gv schema.GroupVersion, kind string, u *unstructured.Unstructured) {
	switch {
	case gv.Group == "" && gv.Version == "v1" && kind == "Namespace":
		if u.GetName() == "" {
			r.problem(d.Location, "Namespace", "metadata.name", "Required value: name or generateName is required")
			return
		}
		r.w.NamespaceLabels[u.GetName()] = u.GetLabels()
		return
	case gv.Group == "" && gv.Version == "v1" && kind == "ConfigMap":
		if _, ok := u.GetLabels()[admission.PolicyLabel]; !ok {
			break
		}
		object := "ConfigMap " + objectName(u)
		if u.GetNamespace() != r.cfg.AdminNamespace {
			r.w.Notes = append(r.w.Notes, Note{Location: d.Location, Message: fmt.Sprintf("%s: an admission rule set counts only in the server's namespace %s; skipped", object, r.cfg.AdminNamespace)})
			return
		}
		var cm corev1.ConfigMap
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cm); err != nil {
			r.problem(d.Location, object, "", "%v", err)
			return
		}
		rs := admission.RuleSetOf(&cm)
		if r.ruleSets == nil {
			r.ruleSets = map[string]admission.RuleSet{}
		}
		if _, dup := r.ruleSets[rs.Name]; dup {
			r.problem(d.Location, object, "metadata.name", "defined twice")
			return
		}
		r.ruleSets[rs.Name] = rs
		r.w.RuleSetAt[rs.Name] = d.Location
		return
	}
	r.skip(d.Location, gv.String()+" "+kind)
}
