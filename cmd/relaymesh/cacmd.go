package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relaymesh/relaymesh/trust"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

const caSynopsis = `verify: read every mesh's Istio CA (the cacerts Secret, public parts only)
  from each workload cluster and check that the intermediate of every mesh
  verifies against every other mesh's root bundle, so that workload
  certificates of one mesh are trusted by all the others. Exits non-zero if
  any pair fails.

  relaymesh ca verify --kubeconfig cluster-1.yaml --kubeconfig cluster-2.yaml`

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func runCA(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "verify" {
		fmt.Fprintf(stderr, "Usage: relaymesh ca verify --kubeconfig FILE [--kubeconfig FILE ...]\n\n%s\n", caSynopsis)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return fmt.Errorf("%w: want verify (status and rotate come with root rotation)", errUsage)
	}
	var kubeconfigs multiFlag
	var namespace string
	fs := newFlags("ca verify", caSynopsis, stderr)
	fs.Var(&kubeconfigs, "kubeconfig", "kubeconfig of a workload cluster (repeat for each); its context name is the cluster's name")
	fs.StringVar(&namespace, "istio-namespace", "istio-system", "namespace of each mesh's cacerts Secret")
	if _, err := parse(fs, args[1:], 0); err != nil {
		return err
	}
	if len(kubeconfigs) < 2 {
		return fmt.Errorf("%w: give at least two --kubeconfig (one per workload cluster)", errUsage)
	}
	var meshes []*trust.MeshCA
	for _, path := range kubeconfigs {
		kube, err := loadKube(path)
		if err != nil {
			return err
		}
		s, err := kube.typed.CoreV1().Secrets(namespace).Get(ctx, trust.SecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: no %s/%s Secret: the mesh has no plugged-in CA", path, namespace, trust.SecretName)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		name := path
		if cfg, err := clientcmd.LoadFromFile(path); err == nil && cfg.CurrentContext != "" {
			name = cfg.CurrentContext
		}
		m, err := trust.ParseMeshCA(name, namespace, s.Data)
		if err != nil {
			return err
		}
		meshes = append(meshes, m)
	}
	now := time.Now()
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ISSUED IN\tTRUSTED BY\tRESULT")
	failed := 0
	for _, from := range meshes {
		for _, to := range meshes {
			if from == to {
				continue
			}
			result := "ok"
			if err := from.VerifyAgainst(to, now); err != nil {
				result, failed = "FAIL: "+err.Error(), failed+1
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", from.Name(), to.Name(), result)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d pairs do not trust each other", failed, len(meshes)*(len(meshes)-1))
	}
	return nil
}
