package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"

	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/relaymesh/relaymesh/server"
	"github.com/relaymesh/relaymesh/server/snapshots"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/all"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

const describeSynopsis = `Translate the current view once, the way the server does, and explain one
object:
  destination NAME                 a discovered Destination, by object name or
                                   as CLUSTER/NAMESPACE/NAME of its Service
                                   (cluster-1/bookinfo/reviews): the policies that
                                   select it in translation order, the
                                   VirtualMeshes that federate it, and the outputs
                                   of those policies that concern it.
  workload NAME                    a discovered Workload: the TrafficPolicies and
                                   AccessPolicies that select it as a source.
  policy KIND/NAMESPACE/NAME       a TrafficPolicy, AccessPolicy, VirtualMesh or
                                   VirtualDestination: its state and errors, what
                                   it selects, and its outputs per cluster.
Only what is in force counts, decided as the server decides it (admission,
namespace tenancy, and live the statuses the server wrote): a refused
policy is shown Invalid and not in force, with no outputs.
The view is read from the management cluster (discovered objects from
--namespace, user objects from every namespace), or with -f from files,
directories (recursive) and - (stdin), as policy audit reads them.`

// describeResources are the resources a translation Input is built from.
var describeResources = struct {
	meshes, workloads, destinations                     schema.GroupVersionResource
	virtualMeshes, traffic, access, virtualDestinations schema.GroupVersionResource
}{
	meshes:              discoveryv1alpha1.Meshes,
	workloads:           discoveryv1alpha1.Workloads,
	destinations:        discoveryv1alpha1.Destinations,
	virtualMeshes:       networkingv1alpha1.VirtualMeshes,
	traffic:             networkingv1alpha1.TrafficPolicies,
	access:              networkingv1alpha1.AccessPolicies,
	virtualDestinations: networkingv1alpha1.VirtualDestinations,
}

func newDescribeCommand(d deps, g *globals) *cobra.Command {
	var files []string
	var output string
	var store snapshotStoreFlags
	c := &cobra.Command{
		Use:   "describe destination|workload|policy NAME",
		Short: "Explain which policies apply to a destination, workload or policy, and their outputs",
		Long:  describeSynopsis,
		Example: `  # A discovered Destination: the policies that select it, in translation order
  relaymesh describe destination cluster-1/bookinfo/reviews --context mgmt

  # A policy: its state, what it selects, its outputs per cluster, as YAML
  relaymesh describe policy trafficpolicy/bookinfo/reviews-canary -o yaml

  # Offline, from the YAML files of a directory
  relaymesh describe workload productpage-v1-bookinfo-cluster-1-deployment -f ./world`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 2 {
				return usagef("want destination|workload|policy and a NAME, got %d argument(s)", len(args))
			}
			return nil
		},
		ValidArgsFunction: completeDescribe(g),
		RunE: func(c *cobra.Command, args []string) error {
			return runDescribe(c.Context(), d, g, files, output, store, args)
		},
	}
	c.Flags().StringArrayVarP(&files, "filename", "f", nil, "read the view from these files, directories (recursive) or - (stdin) instead of a cluster (repeatable)")
	store.registerRead(c.Flags())
	outputFlag(c, &output, printer.Formats, "text")
	return c
}

func runDescribe(ctx context.Context, d deps, g *globals, files []string, format string, store snapshotStoreFlags, pos []string) error {
	namespace, stdout := g.namespace, d.stdout
	var err error
	kind, name := strings.ToLower(pos[0]), pos[1]
	var policyKind, policyNS, policyName string
	switch kind {
	case "destination", "workload":
	case "policy":
		parts := strings.Split(name, "/")
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return usagef("policy %q: want KIND/NAMESPACE/NAME, e.g. trafficpolicy/bookinfo/reviews-canary", name)
		}
		if policyKind, err = translation.PolicyKind(parts[0]); err != nil {
			return usageError{err}
		}
		policyNS, policyName = parts[1], parts[2]
	default:
		return usagef("unknown kind %q: want destination, workload or policy", pos[0])
	}
	switch format {
	case "table", "wide", "text", "json", "yaml":
	default:
		return usagef("-o %q: want table, wide, json or yaml", format)
	}

	v, err := loadView(ctx, d, g, files, namespace, store)
	if err != nil {
		return err
	}
	// Objects the API server would refuse are left out; say which.
	printInput(d.stderr, v.input)
	in := v.in
	_, out, report, err := all.TranslateInForce(ctx, in, v.inForce)
	if err != nil {
		return err
	}

	var desc any
	switch kind {
	case "destination":
		if name, err = destinationNamed(in, name); err != nil {
			return err
		}
		desc, err = all.DescribeDestination(in, out, report, name)
	case "workload":
		desc, err = all.DescribeWorkload(in, report, name)
	default:
		desc, err = all.DescribePolicy(in, out, report, policyKind, policyNS, policyName)
	}
	if err != nil {
		return err
	}
	if format == "json" || format == "yaml" {
		return printer.Print(stdout, printer.Format(format), desc)
	}
	return writeDescription(stdout, desc)
}

// listInput reads the translation input from the management cluster once:
// discovered objects from namespace, user objects from every namespace.
func listInput(ctx context.Context, d deps, kube *kubeclient.Clients, namespace string, store snapshotStoreFlags) (*translation.Input, error) {
	r := describeResources
	client := kube.Dynamic
	clusters, inRedis := registeredClusters(ctx, client, namespace)
	in := &translation.Input{}
	var err error
	if in.Meshes, err = listAs[discoveryv1alpha1.Mesh](ctx, client, r.meshes, namespace); err != nil {
		return nil, err
	}
	// The registry: which trust domains each cluster's meshes may use.
	if in.Clusters, err = listAs[multiclusterv1alpha1.KubernetesCluster](ctx, client, multiclusterv1alpha1.KubernetesClusters, namespace); err != nil {
		return nil, err
	}
	if inRedis {
		in.Workloads, err = storeWorkloads(ctx, d, kube, namespace, store, clusters)
	} else {
		if store.address != "" {
			fmt.Fprintf(d.stderr, "note: --redis-address is not used: no KubernetesCluster in %s keeps its Workloads in Redis; they are read from the apiserver\n", namespace)
		}
		in.Workloads, err = listAs[discoveryv1alpha1.Workload](ctx, client, r.workloads, namespace)
	}
	if err != nil {
		return nil, err
	}
	if in.Destinations, err = listAs[discoveryv1alpha1.Destination](ctx, client, r.destinations, namespace); err != nil {
		return nil, err
	}
	if in.VirtualMeshes, err = listAs[networkingv1alpha1.VirtualMesh](ctx, client, r.virtualMeshes, ""); err != nil {
		return nil, err
	}
	if in.TrafficPolicies, err = listAs[networkingv1alpha1.TrafficPolicy](ctx, client, r.traffic, ""); err != nil {
		return nil, err
	}
	if in.AccessPolicies, err = listAs[networkingv1alpha1.AccessPolicy](ctx, client, r.access, ""); err != nil {
		return nil, err
	}
	if in.VirtualDestinations, err = listAs[networkingv1alpha1.VirtualDestination](ctx, client, r.virtualDestinations, ""); err != nil {
		return nil, err
	}
	return in, nil
}

// registeredClusters lists the registered clusters of namespace, and
// whether any one's status.discovered.workloadsIn says the installation
// keeps its Workloads in the server replicas' snapshot store
// (--snapshot-store=redis). What cannot be read (no permission to list the
// clusters) counts as none.
func registeredClusters(ctx context.Context, client dynamic.Interface, namespace string) (names []string, inRedis bool) {
	list, err := client.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, false
	}
	for _, item := range list.Items {
		names = append(names, item.GetName())
		if in, _, _ := unstructured.NestedString(item.Object, "status", "discovered", "workloadsIn"); in == multiclusterv1alpha1.WorkloadsInRedis {
			inRedis = true
		}
	}
	return names, inRedis
}

// storeWorkloads reads the Workloads of clusters from the replicas'
// snapshot store, each record verified with the replicas' key, as the
// servers' translation sees them. Without --redis-address it refuses: a
// view without them would leave out every source workload.
func storeWorkloads(ctx context.Context, d deps, kube *kubeclient.Clients, namespace string, f snapshotStoreFlags, clusters []string) ([]discoveryv1alpha1.Workload, error) {
	if f.address == "" {
		return nil, errors.New("this installation keeps its Workloads in the server replicas' snapshot store (Redis), not as Workload objects (its KubernetesClusters' status.discovered.workloadsIn: redis): " +
			"a view read from the apiserver alone would leave out every source workload; give --redis-address with --redis-password-file and --redis-ca-file (as the servers have them), " +
			"use the dashboard's Access page (relaymesh dashboard), or -f with exported objects")
	}
	cfg, err := f.config(ctx, kube, namespace, nil, slog.New(slog.NewTextHandler(d.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return nil, err
	}
	store, err := snapshots.New(cfg)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	var out []discoveryv1alpha1.Workload
	for _, c := range clusters {
		rec, _, err := store.Get(ctx, c)
		if errors.Is(err, snapshots.ErrNotFound) {
			continue // no snapshot yet: nothing discovered
		}
		if err != nil {
			return nil, fmt.Errorf("the Workloads of cluster %s in Redis: %w", c, err)
		}
		for _, w := range rec.Snapshot.GetWorkloads() {
			wl, err := server.SharedWorkload(c, namespace, w)
			if err != nil {
				return nil, fmt.Errorf("the Workloads of cluster %s in Redis: %w", c, err)
			}
			out = append(out, wl)
		}
	}
	return out, nil
}

// listAs lists a resource (namespace "": every namespace) as typed objects.
func listAs[T any](ctx context.Context, client dynamic.Interface, gvr schema.GroupVersionResource, namespace string) ([]T, error) {
	list, err := client.Resource(gvr).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", gvr.Resource, err)
	}
	out := make([]T, 0, len(list.Items))
	for i := range list.Items {
		var t T
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(list.Items[i].Object, &t); err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", gvr.Resource, list.Items[i].GetNamespace(), list.Items[i].GetName(), err)
		}
		out = append(out, t)
	}
	return out, nil
}

// writeDescription prints a description as aligned text.
func writeDescription(w io.Writer, desc any) error {
	dw := descWriter{tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	switch d := desc.(type) {
	case *all.DestinationDescription:
		dw.destination(d)
	case *all.WorkloadDescription:
		dw.workload(d)
	case *all.PolicyDescription:
		dw.policy(d)
	default:
		return fmt.Errorf("cannot print %T", desc)
	}
	return dw.tw.Flush()
}

// descWriter writes a description's rows, tab-separated cells aligned.
type descWriter struct{ tw *tabwriter.Writer }

func (dw descWriter) row(cells ...string) { fmt.Fprintln(dw.tw, strings.Join(cells, "\t")) }

func (dw descWriter) policies(title string, ps []all.AppliedPolicy) {
	row := dw.row
	row("")
	if len(ps) == 0 {
		row(title + ":\t<none>")
		return
	}
	row(title + ":")
	row("  #", "POLICY", "STATE", "DETAIL")
	for i, p := range ps {
		row(fmt.Sprintf("  %d", i+1), p.Kind+"/"+p.Namespace+"/"+p.Name, p.State, policyDetail(p))
	}
}

func (dw descWriter) outputs(os []all.OutputRef) {
	row := dw.row
	row("")
	if len(os) == 0 {
		row("Outputs:\t<none>")
		return
	}
	row("Outputs:")
	row("  CLUSTER", "KIND", "NAMESPACE/NAME", "PARENTS")
	for _, o := range os {
		row("  "+o.Cluster, o.Kind, o.Namespace+"/"+o.Name, strings.Join(o.Parents, ","))
	}
}

func (dw descWriter) destination(d *all.DestinationDescription) {
	row := dw.row
	row("Destination:", d.Name)
	row("Service:", d.Service.Namespace+"/"+d.Service.Name)
	row("Cluster:", d.Service.ClusterName)
	row("Mesh:", d.Mesh)
	if d.Waypoint != "" {
		row("Data plane:", d.DataPlane+" (waypoint "+d.Waypoint+")")
	} else {
		row("Data plane:", d.DataPlane)
	}
	row("Routing:", d.Routing)
	row("Hostnames:", strings.Join(d.Hostnames, ", "))
	dw.policies("TrafficPolicies (translation order)", d.Traffic)
	dw.policies("AccessPolicies", d.Access)
	row("")
	if len(d.Federated) == 0 {
		row("Federated by:\t<none>")
	} else {
		row("Federated by:")
		row("  VIRTUALMESH", "STATE", "HOSTNAME", "TO MESHES")
		for _, f := range d.Federated {
			row("  "+f.Namespace+"/"+f.Name, f.State, f.Hostname, strings.Join(f.ToMeshes, ","))
		}
	}
	dw.outputs(d.Outputs)
}

func (dw descWriter) workload(d *all.WorkloadDescription) {
	row := dw.row
	row("Workload:", d.Name)
	row("Controller:", d.ControllerKind+" "+d.Controller.Namespace+"/"+d.Controller.Name)
	row("Cluster:", d.Controller.ClusterName)
	row("Service account:", d.ServiceAccount)
	row("Mesh:", d.Mesh)
	dw.policies("TrafficPolicies selecting it as a source (translation order)", d.Traffic)
	dw.policies("AccessPolicies allowing its identity", d.Access)
}

func (dw descWriter) policy(d *all.PolicyDescription) {
	row := dw.row
	row("Policy:", d.Kind+"/"+d.Namespace+"/"+d.Name)
	row("State:", d.State)
	if d.InForce {
		row("In force:", "yes")
	} else {
		row("In force:", "no — the server does not translate it: it allows, restricts and produces nothing")
	}
	if d.ObservedGeneration != 0 {
		row("Observed generation:", fmt.Sprint(d.ObservedGeneration))
	}
	for _, e := range d.Errors {
		row("Error:", e)
	}
	if len(d.Meshes) > 0 {
		row("Meshes:", strings.Join(d.Meshes, ", "))
	}
	row("Destinations:", orNone(d.Destinations))
	if d.Workloads != nil {
		row("Source workloads:", orNone(d.Workloads))
	}
	if len(d.Targets) > 0 {
		row("")
		row("Targets:")
		row("  TARGET", "STATE", "ERRORS")
		for _, t := range d.Targets {
			row("  "+t.Target, string(t.State), strings.Join(t.Errors, "; "))
		}
	}
	row("")
	if len(d.Outputs) == 0 {
		row("Outputs:\t<none>")
	}
	for _, c := range d.Outputs {
		row("Outputs in " + c.Cluster + ":")
		for _, o := range c.Objects {
			row("  "+o.Kind, o.Namespace+"/"+o.Name, o.APIVersion)
		}
	}
}

// policyDetail is a policy's verdict for the described object, or its errors.
func policyDetail(p all.AppliedPolicy) string {
	var parts []string
	if t := p.Target; t != nil && (t.State != "" && string(t.State) != p.State || len(t.Errors) > 0) {
		parts = append(parts, "target "+string(t.State))
		parts = append(parts, t.Errors...)
	}
	parts = append(parts, p.Errors...)
	return strings.Join(parts, "; ")
}

func orNone(xs []string) string {
	if len(xs) == 0 {
		return "<none>"
	}
	return strings.Join(xs, ", ")
}
