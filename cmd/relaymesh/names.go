package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Names of objects: TAB completion from the management cluster, and the
// CLUSTER/NAMESPACE/NAME form of a Destination that status messages use.

// completionTimeout bounds the reads behind one TAB: a shell waits for it.
const completionTimeout = 5 * time.Second

// completer lists the names a positional argument may take from the
// management cluster.
type completer func(ctx context.Context, kube *kubeclient.Clients, namespace string) ([]string, error)

// completeFrom completes the first positional argument (or every one, with
// all) with what list returns, read from the cluster source names; nothing
// (and no file names) when the cluster cannot be read.
func completeFrom(source func() (kubeclient.Source, error), g *globals, all bool, list completer) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(c *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 && !all {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		src, err := source()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		kube, err := src.Load()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(c.Context(), completionTimeout)
		defer cancel()
		names, err := list(ctx, kube, g.namespace)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, n := range names {
			if strings.HasPrefix(n, prefix) {
				out = append(out, n)
			}
		}
		sort.Strings(out)
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// clusterNames are the registered clusters of namespace.
func clusterNames(ctx context.Context, kube *kubeclient.Clients, namespace string) ([]string, error) {
	kcs, err := listAs[multiclusterv1alpha1.KubernetesCluster](ctx, kube.Dynamic, multiclusterv1alpha1.KubernetesClusters, namespace)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(kcs))
	for _, kc := range kcs {
		out = append(out, kc.Name)
	}
	return out, nil
}

// virtualMeshNames are every VirtualMesh as NAMESPACE/NAME.
func virtualMeshNames(ctx context.Context, kube *kubeclient.Clients, _ string) ([]string, error) {
	vms, err := listAs[networkingv1alpha1.VirtualMesh](ctx, kube.Dynamic, describeResources.virtualMeshes, "")
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(vms))
	for _, vm := range vms {
		out = append(out, vm.Namespace+"/"+vm.Name)
	}
	return out, nil
}

// completeVirtualMeshes completes NAMESPACE/VIRTUALMESH from the cluster of
// the global flags.
func completeVirtualMeshes(g *globals) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return completeFrom(g.source, g, false, virtualMeshNames)
}

// completeDescribe completes describe's kind, then its NAME: a Destination
// as CLUSTER/NAMESPACE/NAME, a Workload by name, a policy as
// KIND/NAMESPACE/NAME.
func completeDescribe(g *globals) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(c *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		switch {
		case len(args) == 0:
			return []string{"destination", "workload", "policy"}, cobra.ShellCompDirectiveNoFileComp
		case len(args) > 1:
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var list completer
		switch strings.ToLower(args[0]) {
		case "destination":
			list = func(ctx context.Context, kube *kubeclient.Clients, ns string) ([]string, error) {
				ds, err := listAs[discoveryv1alpha1.Destination](ctx, kube.Dynamic, describeResources.destinations, ns)
				out := make([]string, 0, len(ds))
				for i := range ds {
					out = append(out, destinationOrigin(&ds[i]))
				}
				return out, err
			}
		case "workload":
			list = func(ctx context.Context, kube *kubeclient.Clients, ns string) ([]string, error) {
				ws, err := listAs[discoveryv1alpha1.Workload](ctx, kube.Dynamic, describeResources.workloads, ns)
				out := make([]string, 0, len(ws))
				for _, w := range ws {
					out = append(out, w.Name)
				}
				return out, err
			}
		case "policy":
			list = policyNames
		default:
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return completeFrom(g.source, g, true, list)(c, nil, prefix)
	}
}

// policyNames are every user policy as KIND/NAMESPACE/NAME (kind in lower
// case, as describe takes it).
func policyNames(ctx context.Context, kube *kubeclient.Clients, _ string) ([]string, error) {
	r := describeResources
	var out []string
	for kind, gvr := range map[string]schema.GroupVersionResource{
		"virtualmesh": r.virtualMeshes, "trafficpolicy": r.traffic, "accesspolicy": r.access, "virtualdestination": r.virtualDestinations,
	} {
		list, err := kube.Dynamic.Resource(gvr).Namespace("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		for _, o := range list.Items {
			out = append(out, kind+"/"+o.GetNamespace()+"/"+o.GetName())
		}
	}
	return out, nil
}

// destinationOrigin is where a Destination was discovered:
// CLUSTER/NAMESPACE/NAME of its Service, the form status messages use.
func destinationOrigin(d *discoveryv1alpha1.Destination) string {
	ref := d.Spec.KubeService.Ref
	return ref.ClusterName + "/" + ref.Namespace + "/" + ref.Name
}

// destinationNamed is the object name of the Destination that name means:
// name itself, or, in the CLUSTER/NAMESPACE/NAME form, the Destination
// discovered from that Service (matched on its structured origin, never by
// parsing object names).
func destinationNamed(in *translation.Input, name string) (string, error) {
	if strings.Count(name, "/") != 2 {
		return name, nil
	}
	var known []string
	for i := range in.Destinations {
		d := &in.Destinations[i]
		origin := destinationOrigin(d)
		if origin == name {
			return d.Name, nil
		}
		known = append(known, origin)
	}
	sort.Strings(known)
	if len(known) > 10 {
		known = append(known[:10], fmt.Sprintf("and %d more", len(known)-10))
	}
	return "", fmt.Errorf("no Destination was discovered from Service %s (CLUSTER/NAMESPACE/NAME); known: %s", name, strings.Join(known, ", "))
}
