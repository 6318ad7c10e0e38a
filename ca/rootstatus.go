package ca

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/relaytrust"
	corev1 "k8s.io/api/core/v1"
)

// How a relay-mode cluster's agent answered the relay trust bundle, as the
// replica holding its session records it on the cluster's
// KubernetesCluster: the server writes them (server/app
// AnnotationBundleAck and AnnotationBundleRefused are these), the
// read-only views (relaymesh ca relay rotate status, relaymesh check, the
// dashboard) read them without the server.
const (
	AnnotationRelayBundleAck     = "relaymesh.io/relay-bundle-ack"
	AnnotationRelayBundleRefused = "relaymesh.io/relay-bundle-refused"
)

// RootAgentRecord is one relay-mode cluster's agent as its KubernetesCluster
// records it for the relay root rotation.
type RootAgentRecord struct {
	Cluster   string
	Connected bool
	// Acked is the bundle fingerprint it acknowledged last; Refused the
	// recorded refusal ("<fingerprint>: <reason>"), empty when none.
	Acked, Refused string
}

// RootAgentRecords are the relay-mode clusters of clusters (kubeconfig-mode
// clusters have no agent and are left out).
func RootAgentRecords(clusters []multiclusterv1alpha1.KubernetesCluster) []RootAgentRecord {
	out := make([]RootAgentRecord, 0, len(clusters))
	for _, kc := range clusters {
		if kc.Spec.Mode == multiclusterv1alpha1.ModeKubeconfig {
			continue
		}
		out = append(out, RootAgentRecord{Cluster: kc.Name, Connected: kc.Status.Connected,
			Acked: kc.Annotations[AnnotationRelayBundleAck], Refused: kc.Annotations[AnnotationRelayBundleRefused]})
	}
	return out
}

// RootStatusCert is one root of the relay root rotation's status.
type RootStatusCert struct {
	Fingerprint string    `json:"fingerprint"`
	Subject     string    `json:"subject"`
	NotAfter    time.Time `json:"notAfter"`
}

// RootStatusCertOf is c as the read-only views show a root.
func RootStatusCertOf(c *x509.Certificate) RootStatusCert {
	return RootStatusCert{Fingerprint: RootFingerprint(c), Subject: c.Subject.String(), NotAfter: c.NotAfter.UTC()}
}

// RootPendingAgent is a cluster whose agent has not acknowledged the
// bundle of the rotation's phase.
type RootPendingAgent struct {
	Cluster   string `json:"cluster"`
	Connected bool   `json:"connected"`
	// Reason says why, for people.
	Reason string `json:"reason"`
	// Refused is the refusal its agent recorded, empty when none.
	Refused string `json:"refused,omitempty"`
}

// RootRotationStatus is the relay root rotation as the read-only views
// show it.
type RootRotationStatus struct {
	Phase      RootPhase          `json:"phase"`
	Revision   int                `json:"revision"`
	Since      *time.Time         `json:"since,omitempty"`
	RolledBack bool               `json:"rolledBack"`
	Request    RootRequest        `json:"pendingRequest,omitempty"`
	OldRoot    *RootStatusCert    `json:"oldRoot"`
	NewRoot    *RootStatusCert    `json:"newRoot,omitempty"`
	Bundle     string             `json:"bundleFingerprint,omitempty"`
	Agents     []RootPendingAgent `json:"agentsNotAcknowledged"`
	Next       string             `json:"next"`
}

// RootRotationStatusOf is the status of st with the relay root Secret's
// roots (RootRotationRoots) and the relay-mode clusters' agents. It is
// pure.
func RootRotationStatusOf(st RootRotationState, req RootRequest, current, staged *x509.Certificate, agents []RootAgentRecord) RootRotationStatus {
	out := RootRotationStatus{Phase: st.Phase, Revision: st.Revision, RolledBack: st.RolledBack, Request: req, Agents: []RootPendingAgent{}}
	if !st.Since.IsZero() {
		since := st.Since.UTC()
		out.Since = &since
	}
	for _, c := range []*x509.Certificate{current, staged} {
		if c == nil {
			continue
		}
		r := new(RootStatusCertOf(c))
		switch r.Fingerprint {
		case st.Old:
			out.OldRoot = r
		case st.New:
			out.NewRoot = r
		}
	}
	if st.Phase != RootIdle {
		out.Bundle = BundleFingerprint(st.Effective().Bundle)
		out.Agents = PendingRootAgents(agents, out.Bundle)
	}
	out.Next = RootRotationNext(st, req, len(out.Agents))
	return out
}

// PendingRootAgents are the agents that have not acknowledged bundle, each
// with why, connected ones first, then by cluster. It is pure.
func PendingRootAgents(agents []RootAgentRecord, bundle string) []RootPendingAgent {
	out := []RootPendingAgent{}
	for _, a := range agents {
		if a.Acked == bundle {
			continue
		}
		p := RootPendingAgent{Cluster: a.Cluster, Connected: a.Connected, Refused: a.Refused}
		switch {
		case !a.Connected:
			p.Reason = "offline: gets the bundle when it reconnects (while the old root is still accepted; after that: " + relaytrust.RebootstrapCommand(p.Cluster) + ")"
		case a.Refused != "":
			p.Reason = "refused: " + a.Refused
		default:
			p.Reason = "has not acknowledged yet"
		}
		out = append(out, p)
	}
	slices.SortStableFunc(out, func(a, b RootPendingAgent) int {
		if a.Connected != b.Connected {
			if a.Connected {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Cluster, b.Cluster)
	})
	return out
}

// RootRotationNext says what happens next in st. It is pure.
func RootRotationNext(st RootRotationState, req RootRequest, pending int) string {
	if req != RootRequestNone {
		return fmt.Sprintf("the server's Lease holder acts on the pending %s request within seconds (nothing happens while no server runs)", req)
	}
	switch st.Phase {
	case RootAddingNew:
		return fmt.Sprintf("every connected agent stores the bundle with both roots and acknowledges it (%d clusters have not); then, once every replica loaded revision %d, issuance and serving switch to the new root (Switching)", pending, st.Revision)
	case RootSwitching:
		return "both roots stay accepted for the grace window (agent certificate lifetime + 2 x --relay-issuer-check-interval) from the switch; then, once no connected agent still uses a certificate under the old root, the old root leaves the bundle (RemovingOldRoot)"
	case RootRemovingOld:
		return fmt.Sprintf("every connected agent stores the bundle with only the new root (%d clusters have not); then the old root's keys are deleted and the new root is the relay root (Idle)", pending)
	}
	return "no rotation in progress: relaymesh ca relay rotate start begins one (the server also starts one by itself past 2/3 of the root's life)"
}

// IssuerGeneration is the generation of the relay issuing CA in the
// signing Secret (SigningSecretName): 1 for the first, one more at each
// renewal and when a root rotation's new root becomes the root. A Secret without the
// annotation holds the first; one that does not parse is an error.
func IssuerGeneration(signing *corev1.Secret) (int, error) {
	v, ok := signing.Annotations[annotationGeneration]
	if !ok {
		return 1, nil
	}
	g, err := strconv.Atoi(v)
	if err != nil || g < 1 || g > 1<<20 {
		return 0, fmt.Errorf("%w: secret %s/%s annotation %s is not a generation number", ErrInvalidSigner, signing.Namespace, signing.Name, annotationGeneration)
	}
	return g, nil
}
