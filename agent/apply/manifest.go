package apply

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/relaymesh/relaymesh/api/outputs"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation"
)

// maxParentsBytes bounds the parents annotation of one object.
const maxParentsBytes = 64 << 10

// parentKind is the kind part of a parent reference.
var parentKind = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,62}$`)

// allowedMetadata are the metadata fields a manifest may set. Everything
// else (ownerReferences, finalizers, generateName, uid, resourceVersion,
// managedFields, deletion fields…) is the agent's or the API server's to set.
var allowedMetadata = map[string]bool{"name": true, "namespace": true, "labels": true, "annotations": true}

// objectKey names one object in the cluster. The version is left out on
// purpose: every version of a kind is the same stored object.
type objectKey struct {
	group, kind, namespace, name string
}

func (k objectKey) String() string {
	return fmt.Sprintf("%s.%s %s/%s", k.kind, k.group, k.namespace, k.name)
}

// identityState says what a manifest's identity means for pruning.
type identityState int

const (
	// identityKnown: the manifest names one object; it is in the set.
	identityKnown identityState = iota
	// identityIrrelevant: the manifest cannot name an object of an allowed
	// kind (another kind, or an unreadable apiVersion).
	identityIrrelevant
	// identityUnknown: the manifest may name an object of an allowed kind,
	// but which one cannot be read; nothing may be pruned.
	identityUnknown
)

// rules are what manifest checking needs from the config.
type rules struct {
	kinds      map[schema.GroupVersionKind]bool
	groupKinds map[schema.GroupKind]bool
	maxBytes   int
	owner      string
	// joinServices: WorkloadEntries may join users' global Services
	// (Config.JoinGlobalServices).
	joinServices bool
}

// manifest is one checked manifest.
type manifest struct {
	// apiVersion, kind, namespace and name, as far as they could be read.
	apiVersion, kind, namespace, name string
	state                             identityState
	key                               objectKey // set when state is identityKnown
	gvk                               schema.GroupVersionKind
	// obj is the object to apply (owner label and parents annotation set),
	// nil when problems is not empty.
	obj      *unstructured.Unstructured
	problems []string
	// joins are the labels of a WorkloadEntry that joins a Service other
	// than its own global one, on joinNetwork; checked against the
	// cluster before it is applied (Applier.checkJoins).
	joins       map[string]string
	joinNetwork string
}

// checkManifest decodes and checks one manifest against r. It is a pure
// function: the object it returns is rebuilt from the parsed manifest (never
// the raw bytes), so the API server sees exactly what was checked.
func checkManifest(r rules, raw []byte, parents []string) *manifest {
	m := &manifest{state: identityUnknown}
	if len(raw) > r.maxBytes {
		m.problems = append(m.problems, fmt.Sprintf("manifest is %d bytes, at most %d", len(raw), r.maxBytes))
		return m
	}
	var v any
	if err := utiljson.Unmarshal(raw, &v); err != nil {
		m.problems = append(m.problems, fmt.Sprintf("manifest is not valid JSON: %v", err))
		return m
	}
	top, ok := v.(map[string]any)
	if !ok {
		m.problems = append(m.problems, "manifest is not a JSON object")
		return m
	}
	m.identify(r, top)
	m.checkFields(top)
	m.checkFederated(top, r.joinServices)
	labels, annotations := m.checkMetadata(top)
	parentsValue := m.checkParents(parents)
	if len(m.problems) > 0 {
		return m
	}
	labels[outputs.OwnerLabel] = r.owner
	annotations[outputs.ParentsAnnotation] = parentsValue
	md := map[string]any{
		"name":        m.name,
		"namespace":   m.namespace,
		"labels":      toAny(labels),
		"annotations": toAny(annotations),
	}
	obj := maps.Clone(top)
	obj["metadata"] = md
	m.obj = &unstructured.Unstructured{Object: obj}
	return m
}

// identify reads apiVersion, kind, name and namespace and checks the kind
// against the allowlist.
func (m *manifest) identify(r rules, top map[string]any) {
	var ok bool
	if m.apiVersion, ok = top["apiVersion"].(string); !ok || m.apiVersion == "" {
		m.problems = append(m.problems, "apiVersion: required string")
	}
	if m.kind, ok = top["kind"].(string); !ok || m.kind == "" {
		m.problems = append(m.problems, "kind: required string")
	}
	m.state = identityUnknown // until the kind is read: it might be an allowed one
	if m.apiVersion != "" && m.kind != "" {
		if gv, err := schema.ParseGroupVersion(m.apiVersion); err != nil {
			m.problems = append(m.problems, fmt.Sprintf("apiVersion %q is not a group/version", m.apiVersion))
			m.state = identityIrrelevant
		} else {
			m.gvk = gv.WithKind(m.kind)
			if !r.kinds[m.gvk] {
				m.problems = append(m.problems, fmt.Sprintf("kind %s is not managed by the agent", kindString(m.gvk)))
			}
			if !r.groupKinds[m.gvk.GroupKind()] {
				m.state = identityIrrelevant
			}
		}
	}
	md, _ := top["metadata"].(map[string]any)
	nameOK, nsOK := false, false
	if m.name, nameOK = md["name"].(string); !nameOK || m.name == "" {
		nameOK = false
		m.problems = append(m.problems, "metadata.name: required string")
	} else if errs := validation.IsDNS1123Subdomain(m.name); len(errs) > 0 {
		m.problems = append(m.problems, "metadata.name: "+errs[0])
	}
	if m.namespace, nsOK = md["namespace"].(string); !nsOK || m.namespace == "" {
		nsOK = false
		m.problems = append(m.problems, "metadata.namespace: required string (the agent manages namespaced objects only)")
	} else if errs := validation.IsDNS1123Label(m.namespace); len(errs) > 0 {
		m.problems = append(m.problems, "metadata.namespace: "+errs[0])
	}
	if m.state == identityUnknown && m.gvk.Kind != "" && nameOK && nsOK {
		m.state = identityKnown
		m.key = objectKey{group: m.gvk.Group, kind: m.gvk.Kind, namespace: m.namespace, name: m.name}
	}
}

// checkFields refuses top-level fields the agent never sends.
func (m *manifest) checkFields(top map[string]any) {
	if _, ok := top["status"]; ok {
		m.problems = append(m.problems, "status is not allowed (the agent applies desired state only)")
	}
}

// checkMetadata refuses metadata fields the manifest may not set and returns
// copies of its labels and annotations.
func (m *manifest) checkMetadata(top map[string]any) (labels, annotations map[string]string) {
	md, _ := top["metadata"].(map[string]any)
	for _, k := range slices.Sorted(maps.Keys(md)) {
		if allowedMetadata[k] || (k == "creationTimestamp" && md[k] == nil) {
			continue // a null creationTimestamp is what Go types marshal to
		}
		m.problems = append(m.problems, fmt.Sprintf("metadata.%s is not allowed", k))
	}
	labels = m.stringMap(md, "labels")
	annotations = m.stringMap(md, "annotations")
	return labels, annotations
}

// stringMap reads metadata.<field> as a map of strings. Anything else is a
// problem: silently dropping it would rewrite the object's metadata.
func (m *manifest) stringMap(md map[string]any, field string) map[string]string {
	out := map[string]string{}
	v, ok := md[field]
	if !ok || v == nil {
		return out
	}
	in, ok := v.(map[string]any)
	if !ok {
		m.problems = append(m.problems, fmt.Sprintf("metadata.%s: must be an object of strings", field))
		return out
	}
	for _, k := range slices.Sorted(maps.Keys(in)) {
		s, ok := in[k].(string)
		if !ok {
			m.problems = append(m.problems, fmt.Sprintf("metadata.%s[%q]: must be a string", field, k))
			continue
		}
		out[k] = s
	}
	return out
}

// checkParents checks every parent reference and returns the annotation
// value: the sorted, de-duplicated parents joined by commas.
func (m *manifest) checkParents(parents []string) string {
	var bad []string
	for i, p := range parents {
		if err := checkParent(p); err != "" {
			bad = append(bad, fmt.Sprintf("parents[%d]: %s", i, err))
		}
	}
	if len(bad) > 3 {
		bad = append(bad[:3], fmt.Sprintf("and %d more bad parents", len(bad)-3))
	}
	m.problems = append(m.problems, bad...)
	sorted := slices.Compact(slices.Sorted(slices.Values(parents)))
	value := strings.Join(sorted, ",")
	if len(value) > maxParentsBytes {
		m.problems = append(m.problems, fmt.Sprintf("parents: the annotation would be %d bytes, at most %d", len(value), maxParentsBytes))
	}
	return value
}

// checkParent checks one "<Kind>/<namespace>/<name>" reference and returns
// what is wrong with it, or "".
func checkParent(p string) string {
	parts := strings.Split(p, "/")
	if len(parts) != 3 {
		return "must be <Kind>/<namespace>/<name>"
	}
	if !parentKind.MatchString(parts[0]) {
		return "kind must be alphanumeric, starting with a letter, at most 63 characters"
	}
	if errs := validation.IsDNS1123Label(parts[1]); len(errs) > 0 {
		return "namespace: " + errs[0]
	}
	if errs := validation.IsDNS1123Subdomain(parts[2]); len(errs) > 0 {
		return "name: " + errs[0]
	}
	return ""
}

// kindString renders a GroupVersionKind as "Kind (group/version)".
func kindString(gvk schema.GroupVersionKind) string {
	return fmt.Sprintf("%s (%s)", gvk.Kind, gvk.GroupVersion().String())
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
