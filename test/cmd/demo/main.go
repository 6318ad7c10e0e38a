// Command demo runs Relaymesh's main job end to end on local clusters
// (`make demo`): it starts a management cluster and two workload clusters,
// applies Istio-shaped sample workloads to the workload clusters and a
// VirtualMesh to the management cluster, prints what is there, and keeps the
// clusters up until Ctrl-C. With DEMO_EXIT=1 it stops and exits after the
// summary, for scripts.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/relaymesh/relaymesh/examples"
	"github.com/relaymesh/relaymesh/test/localcluster"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

const fieldManager = "relaymesh-demo"

// config is what the demo needs from its environment.
type config struct {
	dir       string   // where clusters keep their files
	workloads []string // workload cluster names
	exit      bool     // stop after the summary instead of waiting for a signal
}

func main() {
	cfg := config{dir: "_demo", workloads: []string{"cluster-1", "cluster-2"}}
	if d := os.Getenv("DEMO_DIR"); d != "" {
		cfg.dir = d
	}
	switch v := os.Getenv("DEMO_EXIT"); v {
	case "", "0", "false":
	case "1", "true":
		cfg.exit = true
	default:
		fmt.Fprintf(os.Stderr, "demo: DEMO_EXIT=%q: want 1 or 0\n", v)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, out io.Writer) (err error) {
	// A fresh directory each run: old etcd data would mix with the new.
	if err := os.RemoveAll(cfg.dir); err != nil {
		return err
	}
	step(out, "Starting local clusters: mgmt, %s", strings.Join(cfg.workloads, ", "))
	start := time.Now()
	env, err := localcluster.Start(ctx, localcluster.Config{
		Dir:      filepath.Join(cfg.dir, "clusters"),
		Clusters: append([]string{"mgmt"}, cfg.workloads...),
	})
	if err != nil {
		return err
	}
	defer func() {
		step(out, "Stopping local clusters")
		err = errors.Join(err, env.Stop())
	}()
	fmt.Fprintf(out, "  %d kube-apiservers and one etcd ready in %s\n", len(env.Clusters()), time.Since(start).Round(100*time.Millisecond))
	for _, c := range env.Clusters() {
		fmt.Fprintf(out, "  %-10s %s  KUBECONFIG=%s\n", c.Name, c.URL, c.Kubeconfig)
	}

	step(out, "Applying sample Istio-shaped workloads")
	sample, err := examples.Demo.ReadFile("demo/workload-cluster.yaml")
	if err != nil {
		return err
	}
	for _, name := range cfg.workloads {
		objs, err := env.Cluster(name).Apply(ctx, fieldManager, []byte(strings.ReplaceAll(string(sample), "CLUSTER", name)))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(out, "  %-10s %d objects applied\n", name, len(objs))
	}

	step(out, "Applying the sample VirtualMesh to mgmt")
	vm, err := examples.Demo.ReadFile("demo/virtualmesh.yaml")
	if err != nil {
		return err
	}
	if _, err := env.Cluster("mgmt").Apply(ctx, fieldManager, vm); err != nil {
		return fmt.Errorf("mgmt: %w", err)
	}

	step(out, "What is there")
	if err := summarize(ctx, env, cfg.workloads, out); err != nil {
		return err
	}

	if cfg.exit {
		return nil
	}
	step(out, "Clusters are up; press Ctrl-C to stop them")
	<-ctx.Done()
	return nil
}

func step(out io.Writer, format string, args ...any) {
	fmt.Fprintf(out, "\n==> "+format+"\n", args...)
}

var (
	gvrNamespaces   = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	gvrDeployments  = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	gvrServices     = schema.GroupVersionResource{Version: "v1", Resource: "services"}
	gvrVirtualMeshs = schema.GroupVersionResource{Group: "networking.relaymesh.io", Version: "v1alpha1", Resource: "virtualmeshes"}
)

// summarize prints, per workload cluster, the mesh namespaces and their
// Deployments and Services, then the management cluster's VirtualMeshes as
// the API server stored them (defaults applied).
func summarize(ctx context.Context, env *localcluster.Env, workloads []string, out io.Writer) error {
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tNAMESPACE\tINJECTION\tDEPLOYMENTS\tSERVICES")
	for _, name := range workloads {
		dyn, err := dynamic.NewForConfig(env.Cluster(name).RESTConfig())
		if err != nil {
			return err
		}
		for _, ns := range []string{"istio-system", "bookinfo"} {
			nsObj, err := dyn.Resource(gvrNamespaces).Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("%s: namespace %s: %w", name, ns, err)
			}
			inject := nsObj.GetLabels()["istio-injection"]
			if inject == "" {
				inject = "-"
			}
			deps, err := names(ctx, dyn.Resource(gvrDeployments).Namespace(ns))
			if err != nil {
				return err
			}
			svcs, err := names(ctx, dyn.Resource(gvrServices).Namespace(ns))
			if err != nil {
				return err
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", name, ns, inject, deps, svcs)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	dyn, err := dynamic.NewForConfig(env.Cluster("mgmt").RESTConfig())
	if err != nil {
		return err
	}
	vms, err := dyn.Resource(gvrVirtualMeshs).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VIRTUALMESH\tMESHES\tROOT CA\tROTATION\tHOSTNAME SUFFIX\tGLOBAL ACCESS")
	for _, vm := range vms.Items {
		meshes, _, _ := unstructured.NestedSlice(vm.Object, "spec", "meshes")
		var meshNames []string
		for _, m := range meshes {
			if mm, ok := m.(map[string]any); ok {
				if n, ok := mm["name"].(string); ok {
					meshNames = append(meshNames, n)
				}
			}
		}
		root, _, _ := unstructured.NestedMap(vm.Object, "spec", "mtls", "shared", "rootCA")
		var rootKinds []string
		for k := range root {
			rootKinds = append(rootKinds, k)
		}
		sort.Strings(rootKinds)
		rotation, _, _ := unstructured.NestedString(vm.Object, "spec", "mtls", "rotationStrategy")
		suffix, _, _ := unstructured.NestedString(vm.Object, "spec", "federation", "hostnameSuffix")
		access, _, _ := unstructured.NestedString(vm.Object, "spec", "globalAccessPolicy")
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\t%s\n", vm.GetNamespace(), vm.GetName(),
			strings.Join(meshNames, ","), strings.Join(rootKinds, ","), rotation, suffix, access)
	}
	return tw.Flush()
}

func names(ctx context.Context, ri dynamic.ResourceInterface) (string, error) {
	list, err := ri.List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	var out []string
	for _, o := range list.Items {
		out = append(out, o.GetName())
	}
	sort.Strings(out)
	return strings.Join(out, ","), nil
}
