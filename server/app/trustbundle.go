package app

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// What an agent answered to the relay trust bundle, kept on its
// KubernetesCluster for the Lease holder's relay-root-rotation task and
// `relaymesh ca relay rotate status`
// (docs/design/2026-12-02-relay-root-rotation.md).
const (
	// AnnotationBundleAck is the fingerprint of the bundle the cluster's
	// agent stored and acknowledged last.
	AnnotationBundleAck = ca.AnnotationRelayBundleAck
	// AnnotationBundleRefused is why the agent did not store the current
	// bundle ("<fingerprint>: <reason>"), or that it cannot
	// (BundleCannotAck); removed when it acknowledges.
	AnnotationBundleRefused = ca.AnnotationRelayBundleRefused
)

// BundleCannotAck is the refusal recorded for an agent whose Hello did not
// say trust_bundles: an older agent, never counted as acknowledged.
const BundleCannotAck = "the agent does not handle trust bundles (upgrade it)"

// maxRefusalLen bounds a recorded refusal reason.
const maxRefusalLen = 512

// rotationRoots is what the bundle source reads of the relay CA.
type rotationRoots interface {
	Roots() []*x509.Certificate
	LoadedRootRotation() (ca.RootRotationState, bool)
}

// ackRecord is what is, or is to be, written on one cluster.
type ackRecord struct {
	acked   string // fingerprint acknowledged ("" when refused)
	refused string // "<fingerprint>: <reason>" ("" when acknowledged)
}

// trustBundles is the server.TrustBundleSource of a replica: during a
// relay root rotation the bundle is the roots the replica loaded (in every
// phase they are the roots agents must pin); outside one, only an agent
// whose Hello reported other pinned roots gets the roots the replica
// serves under (it was away when the rotation's last bundle went out).
// Acknowledgements are written on the clusters' KubernetesClusters by one
// goroutine, at most once per cluster and answer.
type trustBundles struct {
	roots     rotationRoots
	client    dynamic.Interface
	namespace string
	log       *slog.Logger

	mu      sync.Mutex
	bundle  *relaypb.TrustBundle
	from    []*x509.Certificate // the roots bundle was made of
	written map[string]ackRecord
	pending map[string]ackRecord
	kick    chan struct{}
}

func newTrustBundles(roots rotationRoots, client dynamic.Interface, namespace string, log *slog.Logger) *trustBundles {
	return &trustBundles{roots: roots, client: client, namespace: namespace, log: log.With("component", "relay-trust-bundle"),
		written: map[string]ackRecord{}, pending: map[string]ackRecord{}, kick: make(chan struct{}, 1)}
}

// Current is the bundle agents must pin during a rotation, else nil. It is
// rebuilt only when the loaded roots change.
func (b *trustBundles) Current() *relaypb.TrustBundle {
	st, rotating := b.roots.LoadedRootRotation()
	if !rotating {
		return nil
	}
	return b.bundleOf(b.roots.Roots(), int64(st.Revision))
}

// Serving is the bundle of the roots the replica serves under outside a
// rotation (revision 0), for an agent that pins others; nil during one
// (Current is the bundle then).
func (b *trustBundles) Serving() *relaypb.TrustBundle {
	if _, rotating := b.roots.LoadedRootRotation(); rotating {
		return nil
	}
	roots := b.roots.Roots()
	if len(roots) == 0 {
		return nil
	}
	return b.bundleOf(roots, 0)
}

// bundleOf is the bundle of roots at revision, rebuilt only when either
// changes.
func (b *trustBundles) bundleOf(roots []*x509.Certificate, revision int64) *relaypb.TrustBundle {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bundle != nil && sameCerts(b.from, roots) && b.bundle.GetRevision() == revision {
		return b.bundle
	}
	b.from = roots
	b.bundle = &relaypb.TrustBundle{RootsPem: ca.CertsPEM(roots...), Fingerprint: ca.TrustBundleFingerprint(roots), Revision: revision}
	return b.bundle
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// Acknowledged queues what cluster's agent answered; it never blocks.
// Nothing is recorded outside a rotation, and an answer equal to the last
// one written for the cluster is not written again.
func (b *trustBundles) Acknowledged(cluster string, canAcknowledge bool, ack *relaypb.TrustBundleAck) {
	var rec ackRecord
	switch {
	case !canAcknowledge:
		cur := b.Current()
		if cur == nil {
			return
		}
		rec.refused = cur.GetFingerprint() + ": " + BundleCannotAck
	case ack.GetError() != "":
		rec.refused = ack.GetFingerprint() + ": " + printable(ack.GetError())
	default:
		rec.acked = ack.GetFingerprint()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.written[cluster] == rec {
		delete(b.pending, cluster)
		return
	}
	b.pending[cluster] = rec
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// printable keeps a refusal reason an agent sent fit for an annotation and
// a log line: printable characters only, at most maxRefusalLen bytes.
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, s)
	if len(s) > maxRefusalLen {
		s = strings.ToValidUTF8(s[:maxRefusalLen], "")
	}
	return s
}

// run writes queued answers until ctx ends; a write that fails is retried
// a second later, one to a cluster that is gone is dropped.
func (b *trustBundles) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.kick:
		}
		for {
			cluster, rec, ok := b.next()
			if !ok {
				break
			}
			err := b.write(ctx, cluster, rec)
			if err == nil {
				continue
			}
			b.mu.Lock()
			if b.written[cluster] == rec {
				delete(b.written, cluster)
			}
			if _, newer := b.pending[cluster]; !newer {
				b.pending[cluster] = rec
			}
			b.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			b.log.Warn("could not record a trust bundle answer; retrying", "cluster", cluster, "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// next takes one queued answer and counts it as written while it is (a
// failed write takes that back), so a repeat meanwhile is not queued.
func (b *trustBundles) next() (string, ackRecord, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for c, rec := range b.pending {
		delete(b.pending, c)
		b.written[c] = rec
		return c, rec, true
	}
	return "", ackRecord{}, false
}

// write patches rec onto cluster's annotations; a refusal keeps the last
// acknowledged fingerprint, an acknowledgement removes the refusal.
func (b *trustBundles) write(ctx context.Context, cluster string, rec ackRecord) error {
	ann := map[string]any{AnnotationBundleRefused: nil}
	if rec.refused != "" {
		ann = map[string]any{AnnotationBundleRefused: rec.refused}
	} else {
		ann[AnnotationBundleAck] = rec.acked
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = b.client.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(b.namespace).Patch(wctx, cluster, types.MergePatchType, body,
		metav1.PatchOptions{FieldManager: "relaymesh-server"})
	if apierrors.IsNotFound(err) {
		return nil // deregistered meanwhile
	}
	if err != nil {
		return fmt.Errorf("patch the annotations of KubernetesCluster %s: %w", cluster, err)
	}
	if rec.refused != "" {
		b.log.Warn("an agent did not store the relay trust bundle", "cluster", cluster, "reason", rec.refused)
	} else {
		b.log.Info("an agent stored and acknowledged the relay trust bundle", "cluster", cluster, "fingerprint", rec.acked)
	}
	return nil
}
