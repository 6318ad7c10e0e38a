package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

const caFederationSynopsis = `SPIFFE federation (docs/spiffe-federation.md): the trust bundles the
server publishes for every trust domain of every VirtualMesh with shared
trust, at GET /bundles/<trust domain> of its bundle endpoint
(relaymesh server --spiffe-bundle-listen), for SPIRE, Istio and other
SPIFFE peers to federate with.`

const caFederationStatusLong = `Show what the bundle endpoint publishes, read from the server's namespace
(the ConfigMap relaymesh-spiffe-bundles every replica serves): per trust
domain its VirtualMesh, its spiffe_sequence (higher on every change of its
roots), when those roots were published (a rotation issues from a new root
only three refresh hints plus --spiffe-bundle-peer-poll after that), its
roots (fingerprint, subject, expiry), and the path peers fetch. Nothing
published: the endpoint is off, or no VirtualMesh with shared trust has a
member yet.

Then the foreign trust domains imported (FederatedTrustDomains in the
namespace, fetched by the server's Lease holder): per peer its state
(Pending: nothing accepted yet; Current: the last fetch was accepted;
Stale: the last fetch was refused and the last accepted bundle is kept;
Invalid: the spec cannot be used, e.g. it names a trust domain of this
Relaymesh), sequence, last fetch, last acceptance, roots and the last
refusal.`

// publishedRoot is one root of a published bundle.
type publishedRoot = ca.RootStatusCert

// publishedBundle is one trust domain's bundle as the endpoint serves it.
type publishedBundle struct {
	TrustDomain string `json:"trustDomain"`
	VirtualMesh string `json:"virtualMesh"`
	Sequence    uint64 `json:"sequence"`
	// Published is when these roots were first published (a rotation
	// issues from a new root only 3 refresh hints + the peers' poll
	// period after it); absent in a state stored before it was recorded.
	Published *time.Time      `json:"published,omitempty"`
	Path      string          `json:"path"`
	Roots     []publishedRoot `json:"roots"`
}

// importedBundle is one foreign trust domain (FederatedTrustDomain) as
// the server's Lease holder last fetched it.
type importedBundle struct {
	Name         string          `json:"name"`
	TrustDomain  string          `json:"trustDomain"`
	Profile      string          `json:"profile"`
	URL          string          `json:"url"`
	State        string          `json:"state"`
	Sequence     uint64          `json:"sequence"`
	LastFetch    *time.Time      `json:"lastFetch,omitempty"`
	LastAccepted *time.Time      `json:"lastAccepted,omitempty"`
	Roots        []publishedRoot `json:"roots"`
	Error        string          `json:"error,omitempty"`
}

// federationStatus is what relaymesh ca federation status prints.
type federationStatus struct {
	// Source is the ConfigMap read, namespace/name.
	Source    string            `json:"source"`
	Published []publishedBundle `json:"published"`
	Imported  []importedBundle  `json:"imported"`
	// ImportedError says why the imported trust domains could not be
	// read (the CRD is not installed, or the caller may not list it).
	ImportedError string `json:"importedError,omitempty"`
}

func newCAFederationCommand(d deps, g *globals) *cobra.Command {
	var output string
	status := &cobra.Command{
		Use: "status", Short: "Show the trust bundles published for SPIFFE federation", Long: caFederationStatusLong,
		Example: "  relaymesh ca federation status --context mgmt\n  relaymesh ca federation status -o json",
		Args:    noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			format, kube, err := formatAndClients(g, output)
			if err != nil {
				return err
			}
			return caFederationStatus(c.Context(), d.stdout, kube, g.namespace, format)
		},
	}
	outputFlag(status, &output, printer.Formats)
	return groupCommand("federation", "SPIFFE federation: the trust bundles the server publishes", caFederationSynopsis,
		"  relaymesh ca federation status", status)
}

func caFederationStatus(ctx context.Context, stdout io.Writer, kube *kubeclient.Clients, namespace string, format printer.Format) error {
	cm, err := kube.Typed.CoreV1().ConfigMaps(namespace).Get(ctx, app.BundleConfigMap, metav1.GetOptions{})
	var data []byte
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("read ConfigMap %s/%s: %w", namespace, app.BundleConfigMap, err)
	default:
		data = []byte(cm.Data[app.BundleStateKey])
	}
	st, err := federationStatusOf(namespace, data)
	if err != nil {
		return err
	}
	switch imported, err := importedBundles(ctx, kube, namespace); {
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || meta.IsNoMatchError(err):
		// What is published is still shown: an upgrade that did not
		// install the CRD, or a caller without list on it.
		st.ImportedError = err.Error()
	case err != nil:
		return err
	default:
		st.Imported = imported
	}
	if format == printer.JSON || format == printer.YAML {
		return printer.Print(stdout, format, st)
	}
	return writeFederationStatus(stdout, st)
}

// federationStatusOf decodes the stored bundles (nil: none stored). A
// stored state that does not decode is an error naming the ConfigMap: the
// server refuses it too and keeps serving what it served before.
func federationStatusOf(namespace string, data []byte) (federationStatus, error) {
	out := federationStatus{Source: namespace + "/" + app.BundleConfigMap, Published: []publishedBundle{}, Imported: []importedBundle{}}
	if len(data) == 0 {
		return out, nil
	}
	st, err := spiffefed.Decode(data)
	if err != nil {
		return out, fmt.Errorf("ConfigMap %s: %w (the server refuses it too and serves the bundles it loaded before)", out.Source, err)
	}
	for _, td := range slices.Sorted(maps.Keys(st.Bundles)) {
		e := st.Bundles[td]
		b := publishedBundle{TrustDomain: td, VirtualMesh: e.VirtualMesh, Sequence: e.Sequence, Path: spiffefed.PathPrefix + td, Roots: []publishedRoot{}}
		if !e.Published.IsZero() {
			at := e.Published.UTC()
			b.Published = &at
		}
		for _, r := range e.Roots {
			b.Roots = append(b.Roots, ca.RootStatusCertOf(r))
		}
		out.Published = append(out.Published, b)
	}
	return out, nil
}

// importedBundles reads the namespace's FederatedTrustDomains.
func importedBundles(ctx context.Context, kube *kubeclient.Clients, namespace string) ([]importedBundle, error) {
	list, err := kube.Dynamic.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list FederatedTrustDomains in %s: %w", namespace, err)
	}
	out := []importedBundle{}
	for _, item := range list.Items {
		var f networkingv1alpha1.FederatedTrustDomain
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.Object, &f); err != nil {
			return nil, fmt.Errorf("FederatedTrustDomain %s/%s: %w", namespace, item.GetName(), err)
		}
		b := importedBundle{Name: f.Name, TrustDomain: f.Spec.TrustDomain, Profile: f.Spec.Profile, URL: f.Spec.BundleEndpointURL,
			State: string(f.Status.State), Sequence: f.Status.Sequence, Error: f.Status.Error, Roots: []publishedRoot{}}
		if b.State == "" {
			b.State = "Pending"
		}
		if t := f.Status.LastFetch; t != nil {
			at := t.UTC()
			b.LastFetch = &at
		}
		if t := f.Status.LastAccepted; t != nil {
			at := t.UTC()
			b.LastAccepted = &at
		}
		if roots, err := spiffefed.ParseRoots([]byte(f.Status.BundlePEM)); err == nil {
			for _, r := range roots {
				b.Roots = append(b.Roots, ca.RootStatusCertOf(r))
			}
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b importedBundle) int {
		return strings.Compare(a.TrustDomain+"/"+a.Name, b.TrustDomain+"/"+b.Name)
	})
	return out, nil
}

// writeFederationStatus prints s as two tables, one line per root: what is
// published, then what is imported.
func writeFederationStatus(w io.Writer, s federationStatus) error {
	if err := writePublished(w, s); err != nil {
		return err
	}
	if s.ImportedError != "" {
		_, err := fmt.Fprintf(w, "\nforeign trust domains not shown: %s\n", text.OneLine(s.ImportedError, 300))
		return err
	}
	if len(s.Imported) == 0 {
		_, err := fmt.Fprintln(w, "\nno foreign trust domain is imported (no FederatedTrustDomain in the namespace)")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nIMPORTED\tNAME\tPROFILE\tSTATE\tSEQUENCE\tLAST FETCH\tLAST ACCEPTED\tROOT\tEXPIRES\tERROR")
	stamp := func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		return t.Format(time.RFC3339)
	}
	for _, b := range s.Imported {
		cols := []string{b.TrustDomain, b.Name, b.Profile, b.State, fmt.Sprint(b.Sequence), stamp(b.LastFetch), stamp(b.LastAccepted), "-", "-", text.OneLine(b.Error, 120)}
		if len(b.Roots) == 0 {
			fmt.Fprintln(tw, strings.Join(cols, "\t"))
		}
		for i, r := range b.Roots {
			if i > 0 {
				cols = []string{"", "", "", "", "", "", "", "", "", ""}
			}
			cols[7], cols[8] = r.Fingerprint[:16], r.NotAfter.Format(time.RFC3339)
			fmt.Fprintln(tw, strings.Join(cols, "\t"))
		}
	}
	return errors.Join(tw.Flush())
}

func writePublished(w io.Writer, s federationStatus) error {
	if len(s.Published) == 0 {
		_, err := fmt.Fprintf(w, "no trust bundle is published (%s holds none): the bundle endpoint is off (relaymesh server --spiffe-bundle-listen) or no VirtualMesh with shared trust has a member yet\n", s.Source)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TRUST DOMAIN\tVIRTUALMESH\tSEQUENCE\tPUBLISHED\tPATH\tROOT\tSUBJECT\tEXPIRES")
	for _, b := range s.Published {
		published := "unknown"
		if b.Published != nil {
			published = b.Published.Format(time.RFC3339)
		}
		for i, r := range b.Roots {
			td, vm, seq, at, path := b.TrustDomain, b.VirtualMesh, fmt.Sprint(b.Sequence), published, b.Path
			if i > 0 {
				td, vm, seq, at, path = "", "", "", "", ""
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", td, vm, seq, at, path, r.Fingerprint[:16], r.Subject, r.NotAfter.Format(time.RFC3339))
		}
	}
	return errors.Join(tw.Flush())
}
