package registration

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/relaymesh/relaymesh/agent/apply"
	"github.com/relaymesh/relaymesh/api/outputs"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/trust"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

// Applied is what an agent applied in its workload cluster and
// RemoveApplied removed (or would remove).
type Applied struct {
	// Objects are the Istio objects, as "Kind namespace/name".
	Objects []string
	// CACerts are the namespaces whose cacerts Secret the agent wrote.
	CACerts []string
	// AuthorizationPolicies counts the AuthorizationPolicies among Objects:
	// removing them (the global deny with them) leaves the mesh to Istio's
	// default, which allows.
	AuthorizationPolicies int
	// Unserved are the kinds the cluster does not serve (nothing of them
	// to remove).
	Unserved []string
}

// RemoveApplied deletes, in the workload cluster, exactly what an agent
// whose owner label value is owner applied: the objects of the agent's
// kinds (apply.DefaultKinds and apply.GatewayRouteKinds) carrying
// outputs.OwnerLabel=owner, and the
// cacerts Secrets carrying outputs.OwnerLabel=owner. Nothing without the label
// is touched (a user's objects, a cacerts the user made); each delete is
// conditional on the UID that was listed. With dryRun it only lists.
// It returns what it removed; on an error, what it removed so far.
func RemoveApplied(ctx context.Context, remote *kubeclient.Clients, owner string, dryRun bool) (Applied, error) {
	var out Applied
	if owner == "" {
		return out, fmt.Errorf("owner label value required")
	}
	sel := labels.SelectorFromSet(labels.Set{outputs.OwnerLabel: owner}).String()
	dc, err := discovery.NewDiscoveryClientForConfig(remote.Config)
	if err != nil {
		return out, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, gvk := range slices.Concat(apply.DefaultKinds, apply.GatewayRouteKinds) {
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if meta.IsNoMatchError(err) {
			out.Unserved = append(out.Unserved, gvk.Kind+"."+gvk.Group)
			continue
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", gvk.Kind, err)
		}
		removed, err := removeOwned(ctx, remote, m.Resource, gvk.Kind, sel, owner, dryRun)
		out.Objects = append(out.Objects, removed...)
		if gvk.Kind == "AuthorizationPolicy" {
			out.AuthorizationPolicies += len(removed)
		}
		if err != nil {
			return out, err
		}
	}
	secrets := remote.Typed.CoreV1().Secrets(metav1.NamespaceAll)
	list, err := secrets.List(ctx, metav1.ListOptions{LabelSelector: outputs.OwnerLabel + "=" + owner, FieldSelector: "metadata.name=" + trust.SecretName})
	if err != nil {
		return out, fmt.Errorf("list the cacerts Secrets the agent wrote: %w", err)
	}
	for _, s := range list.Items {
		if s.Name != trust.SecretName || s.Labels[outputs.OwnerLabel] != owner {
			continue // never trust a selector for a delete
		}
		if !dryRun {
			err := remote.Typed.CoreV1().Secrets(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return out, fmt.Errorf("delete %s/%s: %w", s.Namespace, s.Name, err)
			}
		}
		out.CACerts = append(out.CACerts, s.Namespace)
	}
	sort.Strings(out.Objects)
	sort.Strings(out.CACerts)
	return out, nil
}

// removeOwned deletes the objects of resource whose owner label is owner.
func removeOwned(ctx context.Context, remote *kubeclient.Clients, gvr schema.GroupVersionResource, kind, sel, owner string, dryRun bool) ([]string, error) {
	var removed []string
	opts := metav1.ListOptions{LabelSelector: sel, Limit: 500}
	for {
		list, err := remote.Dynamic.Resource(gvr).Namespace(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return removed, fmt.Errorf("list %s: %w", gvr.Resource, err)
		}
		for i := range list.Items {
			o := &list.Items[i]
			if o.GetLabels()[outputs.OwnerLabel] != owner {
				continue // never trust a selector for a delete
			}
			if !dryRun {
				uid := o.GetUID()
				err := remote.Dynamic.Resource(gvr).Namespace(o.GetNamespace()).Delete(ctx, o.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
				if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					return removed, fmt.Errorf("delete %s %s/%s: %w", kind, o.GetNamespace(), o.GetName(), err)
				}
			}
			removed = append(removed, kind+" "+o.GetNamespace()+"/"+o.GetName())
		}
		if list.GetContinue() == "" {
			return removed, nil
		}
		opts.Continue = list.GetContinue()
	}
}

// CleanupCommands are the kubectl commands that remove what an agent with
// owner applied, for a workload cluster the caller cannot (or chose not
// to) clean up itself.
func CleanupCommands(owner string) []string {
	kinds := make([]string, 0, len(apply.DefaultKinds))
	for _, gvk := range apply.DefaultKinds {
		kinds = append(kinds, Resource(gvk).Resource+"."+gvk.Group)
	}
	// The Gateway API routes (ambient meshes) get a command each: kubectl
	// refuses a whole command that names a resource the cluster does not
	// serve, most clusters without ambient have no Gateway API CRDs, and an
	// older Gateway API has no TCPRoute at v1.
	cmds := []string{
		fmt.Sprintf("kubectl delete %s --all-namespaces -l %s=%s", strings.Join(kinds, ","), outputs.OwnerLabel, owner),
		fmt.Sprintf("kubectl delete secrets --all-namespaces -l %s=%s --field-selector metadata.name=%s", outputs.OwnerLabel, owner, trust.SecretName),
	}
	for _, gvk := range apply.GatewayRouteKinds {
		cmds = append(cmds, fmt.Sprintf("kubectl delete %s --all-namespaces -l %s=%s # only where the cluster serves it", Resource(gvk).Resource+"."+gvk.Group, outputs.OwnerLabel, owner))
	}
	return cmds
}

// Resource is the resource of one of the agent's kinds (apply.DefaultKinds),
// for a command printed without a cluster to ask: the lower-case plural
// (meta.UnsafeGuessKindToResource would say "gatewaies").
func Resource(gvk schema.GroupVersionKind) schema.GroupVersionResource {
	k := strings.ToLower(gvk.Kind)
	switch {
	case strings.HasSuffix(k, "y") && len(k) > 1 && !strings.ContainsRune("aeiou", rune(k[len(k)-2])):
		k = k[:len(k)-1] + "ies"
	case strings.HasSuffix(k, "s"):
		k += "es"
	default:
		k += "s"
	}
	return gvk.GroupVersion().WithResource(k)
}
