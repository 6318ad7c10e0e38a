package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/relaymesh/relaymesh/server/app"
	"github.com/relaymesh/relaymesh/trust/spiffefed"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
roots (fingerprint, subject, expiry), and the path peers fetch. Nothing published: the endpoint is off, or no VirtualMesh with shared
trust has a member yet. Importing foreign trust domains is not built yet,
so there are no peers to show.`

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

// federationStatus is what relaymesh ca federation status prints.
type federationStatus struct {
	// Source is the ConfigMap read, namespace/name.
	Source    string            `json:"source"`
	Published []publishedBundle `json:"published"`
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
	if format == printer.JSON || format == printer.YAML {
		return printer.Print(stdout, format, st)
	}
	return writeFederationStatus(stdout, st)
}

// federationStatusOf decodes the stored bundles (nil: none stored). A
// stored state that does not decode is an error naming the ConfigMap: the
// server refuses it too and keeps serving what it served before.
func federationStatusOf(namespace string, data []byte) (federationStatus, error) {
	out := federationStatus{Source: namespace + "/" + app.BundleConfigMap, Published: []publishedBundle{}}
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

// writeFederationStatus prints s as a table, one line per root.
func writeFederationStatus(w io.Writer, s federationStatus) error {
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
