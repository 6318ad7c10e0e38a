package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/printer"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const relaySynopsis = `The relay CA: the root every agent pins in its cluster's
relay-root-tls-secret, and the issuing CA under it that signs agent and
server certificates. The issuing CA renews itself; the root is rotated with
relaymesh ca relay rotate.`

const relayRotateSynopsis = `Rotate the relay root without stranding an agent
(docs/design/2026-12-02-relay-root-rotation.md). The server's Lease holder
runs the rotation, one phase at a time:

  AddingNewRoot    a new root is made and sent to every agent over its
                   session, beside the old one; each agent stores both and
                   acknowledges.
  Switching        once every connected agent acknowledged and every
                   replica loaded it: certificates are issued and served
                   under the new root; both roots stay accepted for the
                   grace window (the server's --relay-root-grace: by
                   default and at least the agent certificate lifetime
                   + 2 x --relay-issuer-check-interval).
  RemovingOldRoot  after the grace, once no connected agent still uses a
                   certificate under the old root: the old root leaves the
                   bundle; once every connected agent acknowledged that, the
                   old root's keys are deleted and the phase is Idle.

start and rollback only record a request on relay-root-tls-secret in the
server's namespace; the server acts on it within seconds. Only the relay CA
the server generated is rotated this way (not --ca-cert, --ca-secret or
--ca-config). The server also starts a rotation by itself past
--relay-root-renew-at (default 2/3) of the root's life, unless that flag
is 0.`

var relayRotateLong = map[string]string{
	"start": `Ask the server to rotate the relay root: it makes a new root, delivers it
to every agent beside the old one, and switches to it once every connected
agent acknowledged it. Refused while a rotation is in progress or another
request is pending. Follow it with relaymesh ca relay rotate status.`,
	"rollback": `Ask the server to roll the relay root rotation back: from AddingNewRoot
the new root is dropped at once; from Switching issuance and serving return
to the old root at once and the new root leaves after the grace window; from
RemovingOldRoot the old root is delivered again first. Refused when no
rotation is in progress.`,
	"status": `Show the relay root rotation: the phase and since when, the revision,
the old and new roots (fingerprint, subject, expiry), a pending request, the
clusters whose agent has not acknowledged the bundle of this phase (and
why), and what happens next.`,
}

func newCARelayCommand(d deps, g *globals) *cobra.Command {
	var subs []*cobra.Command
	for _, v := range []struct{ verb, short string }{
		{"start", "Ask the server to rotate the relay root every agent pins"},
		{"status", "Show the relay root rotation's phase, roots and the agents it waits for"},
		{"rollback", "Ask the server to roll the relay root rotation back"},
	} {
		var output string
		c := &cobra.Command{
			Use: v.verb, Short: v.short, Long: relayRotateLong[v.verb],
			Example: "  relaymesh ca relay rotate " + v.verb + " --context mgmt",
			Args:    noArgs,
			RunE: func(c *cobra.Command, _ []string) error {
				kube, err := g.clients()
				if err != nil {
					return err
				}
				if v.verb == "status" {
					format, err := printer.Parse(output, printer.Formats)
					if err != nil {
						return usageError{err}
					}
					return relayRotateStatus(c.Context(), d.stdout, kube, g.namespace, format)
				}
				return relayRotateRequest(c.Context(), d.stdout, kube, g.namespace, ca.RootRequest(v.verb))
			},
		}
		if v.verb == "status" {
			outputFlag(c, &output, printer.Formats)
		}
		subs = append(subs, c)
	}
	rotate := groupCommand("rotate", "Rotate the relay root: start, status, rollback", relayRotateSynopsis,
		"  relaymesh ca relay rotate start\n  relaymesh ca relay rotate status", subs...)
	return groupCommand("relay", "The relay CA agents pin: rotate its root", relaySynopsis, "  relaymesh ca relay rotate status", rotate)
}

// readRelayRoot reads the relay root Secret and its rotation state.
func readRelayRoot(ctx context.Context, kube *kubeclient.Clients, namespace string) (*corev1.Secret, ca.RootRotationState, ca.RootRequest, error) {
	s, err := kube.Typed.CoreV1().Secrets(namespace).Get(ctx, ca.RootSecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, ca.RootRotationState{}, "", fmt.Errorf("no relay root Secret %s/%s: the server makes it at its first start with the generated relay CA (is --namespace right?); a relay CA given by --ca-cert, --ca-secret or --ca-config is not rotated by the server", namespace, ca.RootSecretName)
	}
	if err != nil {
		return nil, ca.RootRotationState{}, "", fmt.Errorf("read secret %s/%s: %w", namespace, ca.RootSecretName, err)
	}
	st, req, err := ca.DecodeRootRotation(s)
	if err != nil {
		return nil, ca.RootRotationState{}, "", err
	}
	return s, st, req, nil
}

// relayRotateRequest records start or rollback for the server, after
// checking it makes sense now.
func relayRotateRequest(ctx context.Context, stdout io.Writer, kube *kubeclient.Clients, namespace string, req ca.RootRequest) error {
	_, st, pending, err := readRelayRoot(ctx, kube, namespace)
	if err != nil {
		return err
	}
	if err := requestRefusal(st, pending, req); err != nil {
		return err
	}
	if err := ca.RequestRootRotation(ctx, kube.Typed, namespace, req); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "requested: relay root rotation %s (from phase %s); the server's Lease holder acts on it within seconds.\nFollow it with: relaymesh ca relay rotate status -n %s\n", req, st.Phase, namespace)
	return nil
}

// requestRefusal says why req cannot be recorded in st with pending
// waiting, or nil. It is pure.
func requestRefusal(st ca.RootRotationState, pending, req ca.RootRequest) error {
	switch {
	case pending != ca.RootRequestNone:
		return fmt.Errorf("a relay root rotation request (%s) is already pending: the server has not acted on it yet (is it running?)", pending)
	case req == ca.RootRequestStart && st.Phase != ca.RootIdle:
		return fmt.Errorf("a relay root rotation is already in progress (phase %s, revision %d): see relaymesh ca relay rotate status", st.Phase, st.Revision)
	case req == ca.RootRequestRollback && st.Phase == ca.RootIdle:
		return errors.New("no relay root rotation is in progress: nothing to roll back")
	}
	return nil
}

// relayRootStatus is what relaymesh ca relay rotate status prints; the
// read-only views share it (relaymesh check, the dashboard).
type relayRootStatus = ca.RootRotationStatus

func relayRotateStatus(ctx context.Context, stdout io.Writer, kube *kubeclient.Clients, namespace string, format printer.Format) error {
	s, st, req, err := readRelayRoot(ctx, kube, namespace)
	if err != nil {
		return err
	}
	current, staged, err := ca.RootRotationRoots(s)
	if err != nil {
		return err
	}
	clusters, err := listAs[multiclusterv1alpha1.KubernetesCluster](ctx, kube.Dynamic, multiclusterv1alpha1.KubernetesClusters, namespace)
	if err != nil {
		return err
	}
	out := relayRootStatusOf(st, req, current, staged, clusters)
	if format == printer.JSON || format == printer.YAML {
		return printer.Print(stdout, format, out)
	}
	return writeRelayRootStatus(stdout, out)
}

// relayRootStatusOf is the status of st with the Secret's roots and the
// registered clusters. It is pure.
func relayRootStatusOf(st ca.RootRotationState, req ca.RootRequest, current, staged *x509.Certificate, clusters []multiclusterv1alpha1.KubernetesCluster) relayRootStatus {
	return ca.RootRotationStatusOf(st, req, current, staged, ca.RootAgentRecords(clusters))
}

// writeRelayRootStatus prints s as text.
func writeRelayRootStatus(w io.Writer, s relayRootStatus) error {
	fmt.Fprintf(w, "PHASE %s  REVISION %d", s.Phase, s.Revision)
	if s.Since != nil {
		fmt.Fprintf(w, "  SINCE %s", s.Since.Format(time.RFC3339))
	}
	if s.RolledBack {
		fmt.Fprint(w, "  ROLLED BACK")
	}
	fmt.Fprintln(w)
	for _, r := range []struct {
		name string
		cert *ca.RootStatusCert
	}{{"OLD ROOT", s.OldRoot}, {"NEW ROOT", s.NewRoot}} {
		if r.cert != nil {
			fmt.Fprintf(w, "%s  %s  %s  EXPIRES %s\n", r.name, r.cert.Fingerprint, r.cert.Subject, r.cert.NotAfter.Format(time.RFC3339))
		}
	}
	if s.Request != ca.RootRequestNone {
		fmt.Fprintf(w, "PENDING REQUEST  %s\n", s.Request)
	}
	if s.Bundle != "" {
		fmt.Fprintf(w, "BUNDLE  %s\n", s.Bundle)
		if len(s.Agents) == 0 {
			fmt.Fprintln(w, "every registered agent acknowledged it")
		}
		for _, a := range s.Agents {
			fmt.Fprintf(w, "  NOT ACKNOWLEDGED  %s  %s\n", a.Cluster, a.Reason)
		}
	}
	_, err := fmt.Fprintln(w, "NEXT  "+s.Next)
	return err
}
