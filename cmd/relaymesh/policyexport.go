package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

const policyExportSynopsis = `Write the view an access audit needs, read from a live installation, as
one multi-document YAML file that 'relaymesh policy audit -f' and
'relaymesh describe -f' read back to the same result:
  - the KubernetesClusters of --namespace (spec only: the trust-domain
    grants that decide which meshes a VirtualMesh may federate);
  - the discovered Meshes, Workloads and Destinations of --namespace
    (Workloads from Redis with --redis-address when the installation keeps
    them there, as policy audit reads them);
  - the VirtualMeshes, TrafficPolicies, AccessPolicies and
    VirtualDestinations of every namespace;
  - the Namespaces those live in (their labels, which admission rules may
    read) and the admission rule set ConfigMaps of --namespace (labelled
    relaymesh.io/admission-policy).
Objects are written as they would be applied: apiVersion, kind, name,
namespace, labels, annotations and spec; no status and no server-set
metadata. The view holds no Secret. The output is sorted, so two exports of
an unchanged installation are equal.

With --discovered-only the user objects are left out (their Namespaces
too, but for --namespace): the export is then the world a repository's
policies are audited against, e.g. in CI:
  relaymesh policy audit -f discovered.yaml -f policies/`

func newPolicyExportCommand(d deps, g *globals) *cobra.Command {
	var outPath string
	var discoveredOnly bool
	var store snapshotStoreFlags
	c := &cobra.Command{
		Use:   "export",
		Short: "Write a live installation's view as YAML, for policy audit -f",
		Long:  policyExportSynopsis,
		Example: `  # Export, then audit offline (in CI, or after a change to the files)
  relaymesh policy export --context mgmt --out world.yaml
  relaymesh policy audit -f world.yaml

  # A CI gate: the repository holds the policies, the export the rest
  relaymesh policy export --context mgmt --discovered-only --out discovered.yaml
  relaymesh policy audit -f discovered.yaml -f policies/

  # An installation with --snapshot-store=redis
  relaymesh policy export --redis-address redis:6379 --redis-password-file pw --redis-ca-file ca.pem > world.yaml`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return runPolicyExport(c.Context(), d, g, outPath, discoveredOnly, store)
		},
	}
	c.Flags().StringVar(&outPath, "out", "", "write to this file (mode 0600) instead of stdout")
	c.Flags().BoolVar(&discoveredOnly, "discovered-only", false, "leave out the user objects (VirtualMeshes, TrafficPolicies, AccessPolicies, VirtualDestinations): the world a repository of them is audited against")
	store.registerRead(c.Flags())
	return c
}

func runPolicyExport(ctx context.Context, d deps, g *globals, outPath string, discoveredOnly bool, store snapshotStoreFlags) error {
	if err := errors.Join(store.validate()...); err != nil {
		return usageError{err}
	}
	kube, err := g.clients()
	if err != nil {
		return err
	}
	in, err := listInput(ctx, d, kube, g.namespace, store)
	if err != nil {
		return err
	}
	if discoveredOnly {
		in.VirtualMeshes, in.TrafficPolicies, in.AccessPolicies, in.VirtualDestinations = nil, nil, nil, nil
	}
	var buf bytes.Buffer
	if err := writeExport(ctx, &buf, d.stderr, kube, g.namespace, in); err != nil {
		return err
	}
	if outPath != "" {
		return os.WriteFile(outPath, buf.Bytes(), 0o600)
	}
	_, err = d.stdout.Write(buf.Bytes())
	return err
}

// writeExport writes the Namespaces, rule sets and objects of the view.
func writeExport(ctx context.Context, w io.Writer, stderr io.Writer, kube *kubeclient.Clients, namespace string, in *translation.Input) error {
	fmt.Fprintf(w, "# The view of the Relaymesh installation in namespace %s, written by relaymesh policy export.\n# Audit it with: relaymesh policy audit -n %s -f FILE\n", namespace, namespace)
	e := &exporter{w: w}
	// Namespaces: the server's and every user object's.
	namespaces := map[string]bool{namespace: true}
	for _, ns := range userNamespaces(in) {
		namespaces[ns] = true
	}
	for _, name := range slices.Sorted(maps.Keys(namespaces)) {
		ns, err := kube.Typed.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			fmt.Fprintf(stderr, "note: Namespace %s is not exported (%s): admission rules that read its labels see none offline\n", name, reason(err))
			continue
		}
		e.add(corev1.SchemeGroupVersion.WithKind("Namespace"), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, Labels: ns.Labels}}, nil)
	}
	cms, err := kube.Typed.CoreV1().ConfigMaps(namespace).List(ctx, metav1.ListOptions{LabelSelector: admission.PolicyLabel})
	if err != nil {
		fmt.Fprintf(stderr, "note: the admission rule sets of %s are not exported (%s): the offline audit applies the default rules only\n", namespace, reason(err))
	} else {
		items := cms.Items
		slices.SortFunc(items, func(a, b corev1.ConfigMap) int { return cmp.Compare(a.Name, b.Name) })
		for _, cm := range items {
			e.add(corev1.SchemeGroupVersion.WithKind("ConfigMap"), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: cm.Name, Namespace: cm.Namespace, Labels: cm.Labels}, Data: cm.Data}, nil)
		}
	}
	d, n := discoveryv1alpha1.GroupVersion, networkingv1alpha1.GroupVersion
	// The registry (their trust-domain grants): without it no mesh is
	// federated, offline as on the server.
	exportAll(e, multiclusterv1alpha1.GroupVersion.WithKind("KubernetesCluster"), in.Clusters)
	exportAll(e, d.WithKind("Mesh"), in.Meshes)
	exportAll(e, d.WithKind("Workload"), in.Workloads)
	exportAll(e, d.WithKind("Destination"), in.Destinations)
	exportAll(e, n.WithKind(translation.KindVirtualMesh), in.VirtualMeshes)
	exportAll(e, n.WithKind(translation.KindTrafficPolicy), in.TrafficPolicies)
	exportAll(e, n.WithKind(translation.KindAccessPolicy), in.AccessPolicies)
	exportAll(e, n.WithKind(translation.KindVirtualDestination), in.VirtualDestinations)
	return e.err
}

// userNamespaces are the namespaces of the user objects of in.
func userNamespaces(in *translation.Input) []string {
	var out []string
	for _, o := range in.VirtualMeshes {
		out = append(out, o.Namespace)
	}
	for _, o := range in.TrafficPolicies {
		out = append(out, o.Namespace)
	}
	for _, o := range in.AccessPolicies {
		out = append(out, o.Namespace)
	}
	for _, o := range in.VirtualDestinations {
		out = append(out, o.Namespace)
	}
	return out
}

// exporter writes objects as YAML documents; the first error sticks.
type exporter struct {
	w   io.Writer
	err error
}

// add writes obj as gvk with only its name, namespace, labels and
// annotations (without kubectl's last-applied copy) and spec (or data).
func (e *exporter) add(gvk schema.GroupVersionKind, obj runtime.Object, meta *metav1.ObjectMeta) {
	if e.err != nil {
		return
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		e.err = err
		return
	}
	delete(u, "status")
	if meta != nil {
		annotations := maps.Clone(meta.Annotations)
		delete(annotations, corev1.LastAppliedConfigAnnotation)
		clean := metav1.ObjectMeta{Name: meta.Name, Namespace: meta.Namespace, Labels: meta.Labels, Annotations: annotations}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&clean)
		if err != nil {
			e.err = err
			return
		}
		delete(m, "creationTimestamp")
		u["metadata"] = m
	} else if m, ok := u["metadata"].(map[string]any); ok {
		delete(m, "creationTimestamp")
	}
	u["apiVersion"], u["kind"] = gvk.GroupVersion().String(), gvk.Kind
	b, err := yaml.Marshal(u)
	if err != nil {
		e.err = err
		return
	}
	if _, err := fmt.Fprintf(e.w, "---\n%s", b); err != nil {
		e.err = err
	}
}

// exportAll writes objs sorted by namespace and name.
func exportAll[T any, P interface {
	*T
	runtime.Object
	metav1.Object
}](e *exporter, gvk schema.GroupVersionKind, objs []T) {
	ps := make([]P, len(objs))
	for i := range objs {
		ps[i] = P(&objs[i])
	}
	slices.SortFunc(ps, func(a, b P) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	for _, p := range ps {
		meta := metav1.ObjectMeta{Name: p.GetName(), Namespace: p.GetNamespace(), Labels: p.GetLabels(), Annotations: p.GetAnnotations()}
		e.add(gvk, p, &meta)
	}
}
