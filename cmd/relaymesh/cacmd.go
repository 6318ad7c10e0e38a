package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/trust"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
)

const caSynopsis = `status [VIRTUALMESH]: from the management cluster, each VirtualMesh with shared
  trust: its root (fingerprint, subject, expiry), rotation phase, and the
  intermediate last issued to each mesh (serial, expiry).

  relaymesh ca status --kubeconfig mgmt.yaml [relaymesh/bookinfo-federation]

rotate start|continue|rollback VIRTUALMESH: rotate the shared root with no
  failed handshake between meshes (see relaymesh ca rotate --help).

  relaymesh ca rotate start relaymesh/bookinfo-federation --kubeconfig mgmt.yaml --wait 2m

verify: read every mesh's Istio CA (the cacerts Secret, public parts only)
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
	if len(args) > 0 && args[0] == "status" {
		return runCAStatus(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "rotate" {
		return runCARotate(ctx, args[1:], stdout, stderr)
	}
	if len(args) == 0 || args[0] != "verify" {
		fmt.Fprintf(stderr, "Usage: relaymesh ca status|rotate|verify …\n\n%s\n", caSynopsis)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			return nil
		}
		return fmt.Errorf("%w: want status, rotate or verify", errUsage)
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
	trustDomains := map[*trust.MeshCA]string{}
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
		// The mesh's trust domain, from istiod's mesh config.
		td := discovery.MeshTrustDomain("")
		cm, err := kube.typed.CoreV1().ConfigMaps(namespace).Get(ctx, istioConfigMap, metav1.GetOptions{})
		switch {
		case err == nil:
			td = discovery.MeshTrustDomain(cm.Data[discovery.MeshConfigKey])
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("%s: istio mesh config: %w", path, err)
		}
		trustDomains[m] = td
		meshes = append(meshes, m)
	}
	now := time.Now()
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	failed := 0
	fmt.Fprintln(tw, "MESH\tTRUST DOMAIN\tINTERMEDIATE SIGNS")
	for _, m := range meshes {
		result := "only " + trustDomains[m]
		if err := m.CheckTrustDomain(trustDomains[m]); err != nil {
			result, failed = "FAIL: "+err.Error(), failed+1
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Name(), trustDomains[m], result)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "ISSUED IN\tTRUSTED BY\tRESULT")
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
		return fmt.Errorf("%d of %d checks failed (each mesh's trust domain, then every pair)", failed, len(meshes)+len(meshes)*(len(meshes)-1))
	}
	return nil
}

// istioConfigMap holds istiod's mesh config (the default revision's).
const istioConfigMap = "istio"

func runCAStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var kubeconfig string
	fs := newFlags("ca status [NAMESPACE/VIRTUALMESH]", caSynopsis, stderr)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "management cluster kubeconfig (default: in-cluster)")
	pos, err := parsePositional(fs, args, 1)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		fs.Usage()
		return fmt.Errorf("%w: want at most 1 argument(s), got %d", errUsage, len(pos))
	}
	kube, err := loadKube(kubeconfig)
	if err != nil {
		return err
	}
	vms, err := listAs[networkingv1alpha1.VirtualMesh](ctx, kube.dynamic, networkingv1alpha1.GroupVersion.WithResource("virtualmeshes"), "")
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	shown := 0
	for _, vm := range vms {
		key := vm.Namespace + "/" + vm.Name
		if len(pos) == 1 && pos[0] != key {
			continue
		}
		if vm.Spec.MTLS == nil || vm.Spec.MTLS.Shared == nil {
			continue
		}
		shown++
		st := vm.Status.SharedTrust
		phase := string(networkingv1alpha1.PhaseNotRotating)
		if vm.Status.Rotation != nil {
			phase = string(vm.Status.Rotation.Phase)
		}
		if st == nil {
			fmt.Fprintf(stdout, "VIRTUALMESH %s  no root yet (is the server running, and the VirtualMesh valid? state %q)\n", key, vm.Status.State)
			continue
		}
		expires := ""
		if st.RootNotAfter != nil {
			expires = st.RootNotAfter.UTC().Format(time.DateOnly)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "VIRTUALMESH %s  ROOT %s  FINGERPRINT %s…  EXPIRES %s  ROTATION %s\n", key, st.RootSubject, trust.ShortFingerprint(st.RootFingerprint), expires, phase)
		if r := vm.Status.Rotation; r != nil {
			fmt.Fprintln(stdout, rotationLine(r))
		}
		if st.Message != "" {
			fmt.Fprintln(stdout, "  HELD: "+st.Message)
		}
		fmt.Fprintln(tw, "  MESH\tCLUSTER\tINTERMEDIATE SERIAL\tEXPIRES\tFROM ROOT")
		for _, m := range st.Meshes {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s…\n", m.Mesh, m.Cluster, m.Serial, m.NotAfter.UTC().Format(time.DateOnly), trust.ShortFingerprint(m.Issuer))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if shown == 0 {
		if len(pos) == 1 {
			return fmt.Errorf("no VirtualMesh %s with spec.mtls.shared", pos[0])
		}
		fmt.Fprintln(stdout, "no VirtualMesh asks for shared trust (spec.mtls.shared)")
	}
	return nil
}
