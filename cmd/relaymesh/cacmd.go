package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/discovery"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/trust"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const caSynopsis = `Shared trust between the meshes of a VirtualMesh: the roots, the
intermediate each mesh was issued, root rotation, and a check that every
mesh's CA is trusted by every other mesh.`

func newCACommand(d deps, g *globals) *cobra.Command {
	return groupCommand("ca", "Shared trust: status, root rotation, verification", caSynopsis, `  relaymesh ca status
  relaymesh ca rotate start relaymesh/bookinfo-federation --wait 2m
  relaymesh ca verify
  relaymesh ca relay rotate status
  relaymesh ca federation status`,
		newCAStatusCommand(d, g), newCARotateCommand(d, g), newCAVerifyCommand(d, g), newCARelayCommand(d, g), newCAFederationCommand(d, g))
}

// meshVerdict is one mesh's trust-domain check in ca verify.
type meshVerdict struct {
	Mesh        string `json:"mesh"`
	TrustDomain string `json:"trustDomain"`
	OK          bool   `json:"ok"`
	Result      string `json:"result"`
}

// pairVerdict is one ordered pair of meshes in ca verify.
type pairVerdict struct {
	IssuedIn  string `json:"issuedIn"`
	TrustedBy string `json:"trustedBy"`
	OK        bool   `json:"ok"`
	Result    string `json:"result"`
}

// caVerification is what ca verify prints.
type caVerification struct {
	Meshes []meshVerdict `json:"meshes"`
	Pairs  []pairVerdict `json:"pairs"`
	Failed int           `json:"failed"`
}

func newCAVerifyCommand(d deps, g *globals) *cobra.Command {
	var tc twoClusters
	var remotes []string
	var namespace, output string
	c := &cobra.Command{
		Use:   "verify",
		Short: "Check that every mesh's CA is trusted by every other mesh, and constrained to its trust domain",
		Long: `Read every mesh's Istio CA (the cacerts Secret, public parts only) from each
workload cluster and check that the intermediate of every mesh verifies
against every other mesh's root bundle, so that workload certificates of one
mesh are trusted by all the others; and that each intermediate is
name-constrained to its mesh's trust domain (from istiod's mesh config), so
it cannot sign identities of another mesh. Exits non-zero if any check fails.

The workload clusters are the contexts given with --remote-context (the
context's name is the cluster's name in the output), or by default every
context named after a KubernetesCluster registered in the management cluster
(--mgmt-context, else --context). Repeating --kubeconfig, one file per
workload cluster, still works: each file's current context is a cluster.`,
		Example: `  # Every registered cluster that has a context of the same name
  relaymesh ca verify --mgmt-context mgmt

  # Two named contexts, as JSON
  relaymesh ca verify --remote-context cluster-1 --remote-context cluster-2 -o json

  # One kubeconfig file per workload cluster
  relaymesh ca verify --kubeconfig cluster-1.yaml --kubeconfig cluster-2.yaml`,
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			format, err := printer.Parse(output, printer.Formats)
			if err != nil {
				return usageError{err}
			}
			srcs, err := verifySources(c.Context(), g, &tc, remotes)
			if err != nil {
				return err
			}
			v, err := verifyMeshCAs(c.Context(), srcs, namespace, d.now())
			if err != nil {
				return err
			}
			if format == printer.Table || format == printer.Wide {
				err = writeVerification(d.stdout, v)
			} else {
				err = printer.Print(d.stdout, format, v)
			}
			if err != nil {
				return err
			}
			if v.Failed > 0 {
				return fmt.Errorf("%d of %d checks failed (each mesh's trust domain, then every pair)", v.Failed, len(v.Meshes)+len(v.Pairs))
			}
			return nil
		},
	}
	tc.addFlags(c.Flags(), g, false)
	c.Flags().StringArrayVar(&remotes, "remote-context", nil, "kubeconfig context of a workload cluster (repeat for each; default: every context named after a registered cluster)")
	c.Flags().StringVar(&namespace, "istio-namespace", "istio-system", "namespace of each mesh's cacerts Secret")
	outputFlag(c, &output, printer.Formats)
	_ = c.RegisterFlagCompletionFunc("remote-context", completeContexts(g))
	tc.complete(c, g)
	return c
}

// verifySources are the workload clusters ca verify reads: one per
// repeated --kubeconfig (legacy), the --remote-context list, or every
// context named after a registered cluster.
func verifySources(ctx context.Context, g *globals, tc *twoClusters, remotes []string) ([]kubeclient.Source, error) {
	var srcs []kubeclient.Source
	switch {
	case len(g.kubeconfig) > 1:
		if len(remotes) > 0 {
			return nil, usagef("give either one --kubeconfig per workload cluster or --remote-context, not both")
		}
		for _, path := range g.kubeconfig {
			src := kubeclient.Source{Kubeconfig: path}
			raw, err := src.Raw()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			src.Context = raw.CurrentContext
			srcs = append(srcs, src)
		}
	case len(remotes) > 0:
		file, err := g.kubeconfig.file()
		if err != nil {
			return nil, err
		}
		for _, r := range remotes {
			srcs = append(srcs, kubeclient.Source{Kubeconfig: file, Context: r})
		}
	default:
		mgmtSrc, err := tc.mgmt(g)
		if err != nil {
			return nil, err
		}
		mgmt, err := mgmtSrc.Load()
		if err != nil {
			return nil, fmt.Errorf("management cluster (to find the registered clusters): %w", err)
		}
		kcs, err := listAs[multiclusterv1alpha1.KubernetesCluster](ctx, mgmt.Dynamic, multiclusterv1alpha1.KubernetesClusters, g.namespace)
		if err != nil {
			return nil, err
		}
		file, _ := g.kubeconfig.file()
		for _, kc := range kcs {
			src := kubeclient.Source{Kubeconfig: file, Context: kc.Name}
			if src.HasContext(kc.Name) {
				srcs = append(srcs, src)
			}
		}
	}
	if len(srcs) < 2 {
		return nil, usagef("found %d workload cluster(s); ca verify needs at least two: give --remote-context for each (or one --kubeconfig per cluster)", len(srcs))
	}
	return srcs, nil
}

func verifyMeshCAs(ctx context.Context, srcs []kubeclient.Source, namespace string, now time.Time) (*caVerification, error) {
	var meshes []*trust.MeshCA
	trustDomains := map[*trust.MeshCA]string{}
	for _, src := range srcs {
		kube, err := src.Load()
		if err != nil {
			return nil, err
		}
		s, err := kube.Typed.CoreV1().Secrets(namespace).Get(ctx, trust.SecretName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%s: no %s/%s Secret: the mesh has no plugged-in CA", kube.Context, namespace, trust.SecretName)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", kube.Context, err)
		}
		m, err := trust.ParseMeshCA(kube.Context, namespace, s.Data)
		if err != nil {
			return nil, err
		}
		// The mesh's trust domain, from istiod's mesh config.
		td := discovery.MeshTrustDomain("")
		cm, err := kube.Typed.CoreV1().ConfigMaps(namespace).Get(ctx, istioConfigMap, metav1.GetOptions{})
		switch {
		case err == nil:
			td = discovery.MeshTrustDomain(cm.Data[discovery.MeshConfigKey])
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("%s: istio mesh config: %w", kube.Context, err)
		}
		trustDomains[m] = td
		meshes = append(meshes, m)
	}
	v := &caVerification{Meshes: []meshVerdict{}, Pairs: []pairVerdict{}}
	for _, m := range meshes {
		mv := meshVerdict{Mesh: m.Name(), TrustDomain: trustDomains[m], OK: true, Result: "only " + trustDomains[m]}
		if err := m.CheckTrustDomain(trustDomains[m]); err != nil {
			mv.OK, mv.Result = false, "FAIL: "+err.Error()
			v.Failed++
		}
		v.Meshes = append(v.Meshes, mv)
	}
	for _, from := range meshes {
		for _, to := range meshes {
			if from == to {
				continue
			}
			pv := pairVerdict{IssuedIn: from.Name(), TrustedBy: to.Name(), OK: true, Result: "ok"}
			if err := from.VerifyAgainst(to, now); err != nil {
				pv.OK, pv.Result = false, "FAIL: "+err.Error()
				v.Failed++
			}
			v.Pairs = append(v.Pairs, pv)
		}
	}
	return v, nil
}

func writeVerification(w io.Writer, v *caVerification) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MESH\tTRUST DOMAIN\tINTERMEDIATE SIGNS")
	for _, m := range v.Meshes {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Mesh, m.TrustDomain, m.Result)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "ISSUED IN\tTRUSTED BY\tRESULT")
	for _, p := range v.Pairs {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.IssuedIn, p.TrustedBy, p.Result)
	}
	return tw.Flush()
}

// istioConfigMap holds istiod's mesh config (the default revision's).
const istioConfigMap = "istio"

// meshTrustStatus is one VirtualMesh's shared trust as ca status prints it.
type meshTrustStatus struct {
	VirtualMesh string                                `json:"virtualMesh"`
	State       string                                `json:"state,omitempty"`
	SharedTrust *networkingv1alpha1.SharedTrustStatus `json:"sharedTrust,omitempty"`
	Rotation    *networkingv1alpha1.RotationStatus    `json:"rotation,omitempty"`
}

func newCAStatusCommand(d deps, g *globals) *cobra.Command {
	var output string
	c := &cobra.Command{
		Use:   "status [NAMESPACE/VIRTUALMESH]",
		Short: "Show each shared-trust VirtualMesh's root, rotation phase and mesh intermediates",
		Long: `From the management cluster, each VirtualMesh with shared trust: its root
(fingerprint, subject, expiry), rotation phase, and the intermediate last
issued to each mesh (serial, expiry).`,
		Example: `  relaymesh ca status --context mgmt
  relaymesh ca status relaymesh/bookinfo-federation -o yaml`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("want at most one NAMESPACE/VIRTUALMESH, got %d argument(s)", len(args))
			}
			return nil
		},
		ValidArgsFunction: completeVirtualMeshes(g),
		RunE: func(c *cobra.Command, args []string) error {
			format, kube, err := formatAndClients(g, output)
			if err != nil {
				return err
			}
			return caStatus(c.Context(), d.stdout, kube, args, format)
		},
	}
	outputFlag(c, &output, printer.Formats)
	return c
}

func caStatus(ctx context.Context, stdout io.Writer, kube *kubeclient.Clients, pos []string, format printer.Format) error {
	vms, err := listAs[networkingv1alpha1.VirtualMesh](ctx, kube.Dynamic, networkingv1alpha1.VirtualMeshes, "")
	if err != nil {
		return err
	}
	var statuses []meshTrustStatus
	for _, vm := range vms {
		key := vm.Namespace + "/" + vm.Name
		if len(pos) == 1 && pos[0] != key {
			continue
		}
		if vm.Spec.MTLS == nil || vm.Spec.MTLS.Shared == nil {
			continue
		}
		statuses = append(statuses, meshTrustStatus{VirtualMesh: key, State: string(vm.Status.State), SharedTrust: vm.Status.SharedTrust, Rotation: vm.Status.Rotation})
	}
	if len(statuses) == 0 {
		if len(pos) == 1 {
			return fmt.Errorf("no VirtualMesh %s with spec.mtls.shared", pos[0])
		}
		if format == printer.Table || format == printer.Wide {
			fmt.Fprintln(stdout, "no VirtualMesh asks for shared trust (spec.mtls.shared)")
			return nil
		}
	}
	if format == printer.JSON || format == printer.YAML {
		return printer.Print(stdout, format, map[string]any{"virtualMeshes": orEmpty(statuses)})
	}
	tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
	for _, s := range statuses {
		st := s.SharedTrust
		phase := string(networkingv1alpha1.PhaseNotRotating)
		if s.Rotation != nil {
			phase = string(s.Rotation.Phase)
		}
		if st == nil {
			fmt.Fprintf(stdout, "VIRTUALMESH %s  no root yet (is the server running, and the VirtualMesh valid? state %q)\n", s.VirtualMesh, s.State)
			continue
		}
		expires := ""
		if st.RootNotAfter != nil {
			expires = st.RootNotAfter.UTC().Format(time.DateOnly)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "VIRTUALMESH %s  ROOT %s  FINGERPRINT %s…  EXPIRES %s  ROTATION %s\n", s.VirtualMesh, st.RootSubject, trust.ShortFingerprint(st.RootFingerprint), expires, phase)
		if r := s.Rotation; r != nil {
			fmt.Fprintln(stdout, rotationLine(r))
		}
		if st.Message != "" {
			fmt.Fprintln(stdout, "  HELD: "+st.Message)
		}
		fmt.Fprintln(tw, "  MESH\tCLUSTER\tINTERMEDIATE SERIAL\tEXPIRES\tFROM ROOT")
		for _, m := range st.Meshes {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s…\n", m.Mesh, m.Cluster, m.Serial, m.NotAfter.UTC().Format(time.DateOnly), trust.ShortFingerprint(m.Issuer))
		}
		if len(st.Federation) > 0 {
			if err := tw.Flush(); err != nil {
				return err
			}
			// What the meshes' root-cert.pem carries of each foreign trust
			// domain (spec.mtls.federatedTrustDomains).
			fmt.Fprintln(tw, "  FOREIGN TRUST DOMAIN\tFOREIGN ROOT\tCROSS-CERTIFIED BY\tEXPIRES\tNOT DELIVERED")
			for _, e := range st.Federation {
				root, by, expires := "-", "-", "-"
				if e.ForeignRootFingerprint != "" {
					root = trust.ShortFingerprint(e.ForeignRootFingerprint) + "…"
				}
				if e.IssuerFingerprint != "" {
					by = trust.ShortFingerprint(e.IssuerFingerprint) + "…"
				}
				if e.NotAfter != nil {
					expires = e.NotAfter.UTC().Format(time.DateOnly)
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", text.OneLine(e.TrustDomain, 255), root, by, expires, text.OneLine(e.Message, 300))
			}
		}
	}
	return tw.Flush()
}

// orEmpty is s, or an empty slice for nil (so JSON shows [] not null).
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
