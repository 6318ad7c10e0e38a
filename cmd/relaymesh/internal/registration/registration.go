// Package registration registers a workload cluster with the management
// cluster: the KubernetesCluster, a single-use bootstrap token, and the
// bundle the workload cluster's agent needs — its Secrets
// (relay-root-tls-secret with the relay root only, relay-identity-token-
// secret with the token), the relaymesh-agent-config ConfigMap and the
// values of the relaymesh-agent chart.
//
// The bundle is either written into the workload cluster (WriteTo), with
// the chart installed through the Helm SDK (InstallChart), or printed for a
// GitOps repository (Objects, RenderChart). Everything that can fail is
// checked before anything is written, and a registration that fails half
// way is rolled back, so a retry starts clean.
package registration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
	"github.com/relaymesh/relaymesh/identity"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/relaymesh/relaymesh/internal/kubeutil"
	"github.com/relaymesh/relaymesh/internal/text"
	"github.com/relaymesh/relaymesh/relay"
	"github.com/relaymesh/relaymesh/translation"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
)

// AgentConfigMap is where registration leaves the agent's settings.
const AgentConfigMap = "relaymesh-agent-config"

// managedBy labels what registration writes.
var managedBy = map[string]string{"app.kubernetes.io/managed-by": "relaymesh"}

// Request is a registration of one cluster in relay mode.
type Request struct {
	// Cluster is the cluster's name, a DNS label.
	Cluster string
	// Namespace is the server's namespace in the management cluster.
	Namespace string
	// RemoteNamespace is the agent's namespace in the workload cluster.
	RemoteNamespace string
	// ServerAddress is host:port of the relay as the agent reaches it.
	ServerAddress string
	// ClusterDomain is the workload cluster's DNS suffix.
	ClusterDomain string
	// TokenTTL is how long the bootstrap token is valid.
	TokenTTL time.Duration
	// TrustDomains are the trust domains the cluster's meshes may use (the
	// KubernetesCluster's spec.trustDomains); none: the default grant,
	// `<cluster>.local`, written out.
	TrustDomains []multiclusterv1alpha1.TrustDomainGrant
}

// Validate reports every problem with the request.
func (r Request) Validate() error {
	var errs []error
	if err := identity.ValidateClusterName(r.Cluster); err != nil {
		errs = append(errs, err)
	}
	if r.Namespace == "" || r.RemoteNamespace == "" {
		errs = append(errs, errors.New("the server's and the agent's namespaces must not be empty"))
	}
	if r.ServerAddress == "" {
		errs = append(errs, errors.New("--server-address is required: the relay server's host:port as the agent reaches it"))
	} else if _, _, err := net.SplitHostPort(r.ServerAddress); err != nil {
		errs = append(errs, fmt.Errorf("--server-address %q: %w", r.ServerAddress, err))
	}
	if r.TokenTTL <= 0 || r.TokenTTL > identity.MaxTokenTTL {
		errs = append(errs, fmt.Errorf("--token-ttl %s out of range (0, %s]", r.TokenTTL, identity.MaxTokenTTL))
	}
	if err := ValidateGrants(r.TrustDomains); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// maxGrants is how many trust domains one cluster may be granted (the
// CRD's bound).
const maxGrants = 32

// ValidateGrants reports every trust domain that the KubernetesCluster
// schema would refuse: not a trust domain a mesh may report
// (relay.CheckTrustDomain), repeated, or too many.
func ValidateGrants(grants []multiclusterv1alpha1.TrustDomainGrant) error {
	var errs []error
	if len(grants) > maxGrants {
		errs = append(errs, fmt.Errorf("%d trust domains: at most %d", len(grants), maxGrants))
	}
	seen := map[string]bool{}
	for _, g := range grants {
		if err := relay.CheckTrustDomain(g.Name); err != nil {
			errs = append(errs, fmt.Errorf("--trust-domain %q: %w", text.Truncate(g.Name, 80), err))
			continue
		}
		if seen[g.Name] {
			errs = append(errs, fmt.Errorf("--trust-domain %q is given twice", g.Name))
		}
		seen[g.Name] = true
	}
	return errors.Join(errs...)
}

// Grants returns grants, or the default grant of cluster when there are none.
func Grants(cluster string, grants []multiclusterv1alpha1.TrustDomainGrant) []multiclusterv1alpha1.TrustDomainGrant {
	if len(grants) > 0 {
		return grants
	}
	return []multiclusterv1alpha1.TrustDomainGrant{{Name: multiclusterv1alpha1.DefaultTrustDomain(cluster)}}
}

// CheckExclusive refuses grants for cluster that another registered
// cluster already holds, unless both mark them shared: such a grant would
// take the trust domain from both (the server refuses a trust domain held
// twice). The server enforces it whatever registered the clusters; this
// is the early, clear error.
func CheckExclusive(registered []multiclusterv1alpha1.KubernetesCluster, cluster string, grants []multiclusterv1alpha1.TrustDomainGrant) error {
	all := append(slices.Clone(registered), multiclusterv1alpha1.KubernetesCluster{ObjectMeta: metav1.ObjectMeta{Name: cluster},
		Spec: multiclusterv1alpha1.KubernetesClusterSpec{TrustDomains: Grants(cluster, grants)}})
	g := translation.NewGrants(all)
	var errs []error
	for _, gr := range Grants(cluster, grants) {
		var ge *translation.GrantError
		if err := g.Authorize(cluster, gr.Name); errors.As(err, &ge) && ge.Reason == translation.RefusedConflict {
			var others []string
			for _, h := range ge.Holders {
				if h != cluster {
					others = append(others, h)
				}
			}
			errs = append(errs, fmt.Errorf("trust domain %q is already granted to cluster %s: granting it to %s as well would leave it to neither; give %s a trust domain of its own (--trust-domain), or, if the clusters are meant to share it (WEAKER: each can sign the other's identities), mark it shared on every holder (--shared-trust-domain here, shared: true in their KubernetesClusters' spec.trustDomains)",
				gr.Name, strings.Join(others, ", "), cluster, cluster))
		}
	}
	return errors.Join(errs...)
}

// newCluster is the KubernetesCluster of a registration, with its grant
// written out, after checking the grant against the registered clusters.
func newCluster(ctx context.Context, mgmt *kubeclient.Clients, namespace, name string, spec multiclusterv1alpha1.KubernetesClusterSpec) (*unstructured.Unstructured, error) {
	clusters := mgmt.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(namespace)
	list, err := clusters.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the registered clusters: %w", err)
	}
	var registered []multiclusterv1alpha1.KubernetesCluster
	for _, u := range list.Items {
		var kc multiclusterv1alpha1.KubernetesCluster
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &kc); err != nil {
			return nil, fmt.Errorf("KubernetesCluster %s: %w", u.GetName(), err)
		}
		registered = append(registered, kc)
	}
	spec.TrustDomains = Grants(name, spec.TrustDomains)
	if err := CheckExclusive(registered, name, spec.TrustDomains); err != nil {
		return nil, err
	}
	kc := &multiclusterv1alpha1.KubernetesCluster{
		TypeMeta:   metav1.TypeMeta{APIVersion: multiclusterv1alpha1.GroupVersion.String(), Kind: "KubernetesCluster"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       spec,
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(kc)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: obj}, nil
}

// Bundle is what the workload cluster's agent needs. It holds a bootstrap
// token: never log it, and print it only where the user asked for it.
type Bundle struct {
	Cluster   string
	Namespace string
	// TokenID identifies the token (not secret); ExpiresAt is its expiry.
	TokenID   string
	ExpiresAt time.Time
	// Secrets are relay-root-tls-secret and relay-identity-token-secret.
	Secrets []*corev1.Secret
	// ConfigMap is relaymesh-agent-config.
	ConfigMap *corev1.ConfigMap
	// Values are the relaymesh-agent chart's values for this cluster.
	Values map[string]any
}

// Register creates the KubernetesCluster and mints the bootstrap token in
// the management cluster and returns the bundle. On error nothing is left;
// after success, rollback undoes the registration (for a failure in the
// workload cluster).
func Register(ctx context.Context, mgmt *kubeclient.Clients, req Request) (b *Bundle, rollback func(context.Context), err error) {
	if err := req.Validate(); err != nil {
		return nil, nil, err
	}
	if req.ClusterDomain == "" {
		req.ClusterDomain = "cluster.local"
	}
	roots, err := ca.RelayRootsPEM(ctx, mgmt.Typed, req.Namespace)
	if err != nil {
		return nil, nil, fmt.Errorf("relay CA not found in %s (start 'relaymesh server' once first): %w", req.Namespace, err)
	}
	clusters := mgmt.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(req.Namespace)
	if _, err := clusters.Get(ctx, req.Cluster, metav1.GetOptions{}); err == nil {
		return nil, nil, fmt.Errorf("cluster %s is already registered; deregister it first, or mint a new token with 'relaymesh token create --cluster %s'", req.Cluster, req.Cluster)
	} else if !apierrors.IsNotFound(err) {
		return nil, nil, err
	}
	kc, err := newCluster(ctx, mgmt, req.Namespace, req.Cluster, multiclusterv1alpha1.KubernetesClusterSpec{Mode: multiclusterv1alpha1.ModeRelay,
		ClusterDomain: req.ClusterDomain, TrustDomains: req.TrustDomains})
	if err != nil {
		return nil, nil, err
	}
	if _, err := clusters.Create(ctx, kc, metav1.CreateOptions{}); err != nil {
		return nil, nil, fmt.Errorf("create KubernetesCluster %s: %w", req.Cluster, err)
	}
	rollback = func(ctx context.Context) {
		ctx = context.WithoutCancel(ctx)
		_ = clusters.Delete(ctx, req.Cluster, metav1.DeleteOptions{})
		if store, serr := identity.NewKubeTokenStore(mgmt.Typed, req.Namespace); serr == nil {
			_ = store.DeleteCluster(ctx, req.Cluster)
		}
	}
	token, rec, err := MintToken(ctx, mgmt.Typed, req.Namespace, req.Cluster, req.TokenTTL)
	if err != nil {
		rollback(ctx)
		return nil, nil, err
	}
	ns := req.RemoteNamespace
	b = &Bundle{Cluster: req.Cluster, Namespace: ns, TokenID: rec.ID, ExpiresAt: rec.ExpiresAt,
		Secrets: agentSecrets(ns, roots, token),
		ConfigMap: &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}, ObjectMeta: metav1.ObjectMeta{Name: AgentConfigMap, Namespace: ns, Labels: managedBy},
			Data: map[string]string{"cluster": req.Cluster, "serverAddress": req.ServerAddress}},
		Values: map[string]any{"cluster": req.Cluster, "serverAddress": req.ServerAddress},
	}
	return b, rollback, nil
}

// agentSecrets are the agent's bootstrap Secrets in its namespace ns:
// relay-root-tls-secret with the relay roots the server trusts now,
// relay-identity-token-secret with a bootstrap token.
func agentSecrets(ns string, roots []byte, token string) []*corev1.Secret {
	secret := func(name, key string, value []byte) *corev1.Secret {
		return &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: managedBy},
			Type: corev1.SecretTypeOpaque, Data: map[string][]byte{key: value}}
	}
	return []*corev1.Secret{secret(identity.RootSecret, identity.KeyCACert, roots), secret(identity.TokenSecret, identity.KeyToken, []byte(token))}
}

// RebootstrapRequest is a new bootstrap of a registered relay-mode
// cluster's agent.
type RebootstrapRequest struct {
	// Cluster is the cluster's name, a DNS label.
	Cluster string
	// Namespace is the server's namespace in the management cluster.
	Namespace string
	// RemoteNamespace is the agent's namespace in the workload cluster.
	RemoteNamespace string
	// TokenTTL is how long the bootstrap token is valid.
	TokenTTL time.Duration
}

// Validate reports every problem with the request.
func (r RebootstrapRequest) Validate() error {
	var errs []error
	if err := identity.ValidateClusterName(r.Cluster); err != nil {
		errs = append(errs, err)
	}
	if r.Namespace == "" || r.RemoteNamespace == "" {
		errs = append(errs, errors.New("the server's and the agent's namespaces must not be empty"))
	}
	if r.TokenTTL <= 0 || r.TokenTTL > identity.MaxTokenTTL {
		errs = append(errs, fmt.Errorf("--token-ttl %s out of range (0, %s]", r.TokenTTL, identity.MaxTokenTTL))
	}
	return errors.Join(errs...)
}

// ErrNotRegistered: the cluster has no KubernetesCluster.
var ErrNotRegistered = errors.New("cluster is not registered")

// Rebootstrap prepares a new bootstrap of a registered relay-mode
// cluster's agent — the recovery of an agent that pins a relay root the
// server no longer chains to (offline through a root rotation) or whose
// certificate expired: it mints a single-use bootstrap token (MintToken,
// audited as 'token create' is) and returns the bundle of the agent's two
// Secrets with it and the relay roots the server trusts now (every root of
// relay-root-tls-secret: during a rotation, both). The bundle has no
// ConfigMap or chart values: the registration's stand. Nothing else in the
// management cluster is read or changed — the KubernetesCluster (spec,
// grants, status, annotations) stays as it is. A cluster that is not
// registered, or registered in kubeconfig mode (it has no agent), is
// refused before anything is minted.
func Rebootstrap(ctx context.Context, mgmt *kubeclient.Clients, req RebootstrapRequest) (*Bundle, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	u, err := mgmt.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(req.Namespace).Get(ctx, req.Cluster, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: no KubernetesCluster %s in %s; register it with 'relaymesh cluster register %s' (re-bootstrap only renews the agent's trust of a registered cluster)",
			ErrNotRegistered, req.Cluster, req.Namespace, req.Cluster)
	}
	if err != nil {
		return nil, fmt.Errorf("get KubernetesCluster %s: %w", req.Cluster, err)
	}
	if mode, _, _ := unstructured.NestedString(u.Object, "spec", "mode"); mode == string(multiclusterv1alpha1.ModeKubeconfig) {
		return nil, fmt.Errorf("cluster %s is registered in kubeconfig mode: no agent runs there, so there is nothing to re-bootstrap", req.Cluster)
	}
	roots, err := ca.RelayRootsPEM(ctx, mgmt.Typed, req.Namespace)
	if err != nil {
		return nil, fmt.Errorf("relay CA not found in %s: %w", req.Namespace, err)
	}
	token, rec, err := MintToken(ctx, mgmt.Typed, req.Namespace, req.Cluster, req.TokenTTL)
	if err != nil {
		return nil, err
	}
	return &Bundle{Cluster: req.Cluster, Namespace: req.RemoteNamespace, TokenID: rec.ID, ExpiresAt: rec.ExpiresAt,
		Secrets: agentSecrets(req.RemoteNamespace, roots, token)}, nil
}

// MintToken mints a single-use bootstrap token for cluster.
func MintToken(ctx context.Context, mgmt kubernetes.Interface, namespace, cluster string, ttl time.Duration) (string, identity.TokenRecord, error) {
	store, err := identity.NewKubeTokenStore(mgmt, namespace)
	if err != nil {
		return "", identity.TokenRecord{}, err
	}
	// Who mints, as the apiserver authenticated us: the server's audit
	// record names it.
	review, err := mgmt.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return "", identity.TokenRecord{}, fmt.Errorf("ask the management apiserver who we are (SelfSubjectReview), for the token's audit record: %w", err)
	}
	store.MintedBy = review.Status.UserInfo.Username
	tokens, err := identity.NewTokens(identity.TokensConfig{Store: store})
	if err != nil {
		return "", identity.TokenRecord{}, err
	}
	return tokens.Mint(ctx, cluster, ttl)
}

// RevokeToken removes the bootstrap token id of namespace (one minted but
// not delivered), so that it cannot be redeemed later from wherever part of
// it went. A spent token's record is removed too, which ends its retry
// window (a replica that already issued for it may still answer the same
// certificate until the window ends); one already gone is no error.
func RevokeToken(ctx context.Context, mgmt kubernetes.Interface, namespace, id string) error {
	store, err := identity.NewKubeTokenStore(mgmt, namespace)
	if err != nil {
		return err
	}
	rec, err := store.Get(ctx, id)
	if errors.Is(err, identity.ErrTokenNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := store.Consume(ctx, rec); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("revoke bootstrap token %s: %w", id, err)
	}
	return nil
}

// Objects are the bundle as objects to apply: the namespace, the two
// Secrets and the ConfigMap (if the bundle has one).
func (b *Bundle) Objects() []runtime.Object {
	objs := []runtime.Object{&corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: b.Namespace}}}
	for _, s := range b.Secrets {
		objs = append(objs, s)
	}
	if b.ConfigMap != nil {
		objs = append(objs, b.ConfigMap)
	}
	return objs
}

// WriteTo writes the bundle into the workload cluster. A client
// certificate of an earlier registration (or, for Rebootstrap, the stale
// one under a root the server no longer trusts) is removed first: the
// agent must bootstrap with the new token.
func (b *Bundle) WriteTo(ctx context.Context, remote kubernetes.Interface) error {
	if _, err := remote.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", b.Namespace, err)
	}
	if err := remote.CoreV1().Secrets(b.Namespace).Delete(ctx, identity.ClientSecret, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove the stale %s/%s in the workload cluster: %w", b.Namespace, identity.ClientSecret, err)
	}
	for _, s := range b.Secrets {
		if err := kubeutil.UpsertSecret(ctx, remote, s.DeepCopy()); err != nil {
			return fmt.Errorf("write %s/%s in the workload cluster: %w", b.Namespace, s.Name, err)
		}
	}
	if b.ConfigMap == nil {
		return nil
	}
	cm := b.ConfigMap.DeepCopy()
	_, err := remote.CoreV1().ConfigMaps(b.Namespace).Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = remote.CoreV1().ConfigMaps(b.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write %s/%s in the workload cluster: %w", b.Namespace, AgentConfigMap, err)
	}
	return nil
}

// Deregister deletes the KubernetesCluster, its unused tokens and (for
// kubeconfig mode) its kubeconfig Secret in the management cluster.
func Deregister(ctx context.Context, mgmt *kubeclient.Clients, namespace, cluster string) error {
	err := mgmt.Dynamic.Resource(multiclusterv1alpha1.KubernetesClusters).Namespace(namespace).Delete(ctx, cluster, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("cluster %s is not registered in %s", cluster, namespace)
	}
	if err != nil {
		return err
	}
	store, err := identity.NewKubeTokenStore(mgmt.Typed, namespace)
	if err != nil {
		return err
	}
	if err := store.DeleteCluster(ctx, cluster); err != nil {
		return fmt.Errorf("delete bootstrap tokens of %s: %w", cluster, err)
	}
	if err := mgmt.Typed.CoreV1().Secrets(namespace).Delete(ctx, multiclusterv1alpha1.KubeconfigSecretName(cluster), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the kubeconfig secret of %s: %w", cluster, err)
	}
	return nil
}

// RemoveAgentSecrets removes what registration wrote into the workload
// cluster.
func RemoveAgentSecrets(ctx context.Context, remote kubernetes.Interface, namespace string) error {
	for _, s := range []string{identity.ClientSecret, identity.TokenSecret, identity.RootSecret} {
		if err := remote.CoreV1().Secrets(namespace).Delete(ctx, s, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s/%s in the workload cluster: %w", namespace, s, err)
		}
	}
	if err := remote.CoreV1().ConfigMaps(namespace).Delete(ctx, AgentConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// ErrServerNamespace means the agent's namespace in the workload cluster is
// the relay server's own: the management cluster registered as its own
// workload cluster with the agent beside the server.
var ErrServerNamespace = errors.New("the agent's namespace is the relay server's")

// CheckAgentNamespace refuses a workload-cluster namespace that is the relay
// server's own, before anything is written there: the agent's Secrets would
// overwrite the server's relay-root-tls-secret (its root key with it), and
// deregistering would delete it. It is the server's when it holds the
// server's relay CA Secrets (the generated CA: relay-tls-signing-secret, or
// a root Secret with a key), or when it has the server's namespace name in
// the same cluster (kube-system's UID, else the API server's address, is
// the same: a provided CA keeps no key in the cluster).
func CheckAgentNamespace(ctx context.Context, mgmt, remote *kubeclient.Clients, namespace, remoteNamespace string) error {
	refuse := func(why string) error {
		return fmt.Errorf("%w: %s; the agent's Secrets would overwrite the server's %s and deregistering would delete it. "+
			"To register the management cluster as its own workload cluster, give the agent a namespace of its own (--remote-namespace relaymesh-agent, and the agent's --namespace)",
			ErrServerNamespace, why, ca.RootSecretName)
	}
	secrets := remote.Typed.CoreV1().Secrets(remoteNamespace)
	if _, err := secrets.Get(ctx, ca.SigningSecretName, metav1.GetOptions{}); err == nil {
		return refuse(fmt.Sprintf("namespace %s of the workload cluster holds the relay issuing CA (%s)", remoteNamespace, ca.SigningSecretName))
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("check namespace %s of the workload cluster: %w", remoteNamespace, err)
	}
	if root, err := secrets.Get(ctx, ca.RootSecretName, metav1.GetOptions{}); err == nil {
		if _, ok := root.Data[corev1.TLSPrivateKeyKey]; ok {
			return refuse(fmt.Sprintf("namespace %s of the workload cluster holds the relay root key (%s)", remoteNamespace, ca.RootSecretName))
		}
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("check namespace %s of the workload cluster: %w", remoteNamespace, err)
	}
	if namespace == remoteNamespace && sameCluster(ctx, mgmt, remote) {
		return refuse(fmt.Sprintf("the workload cluster is the management cluster and namespace %s is the server's --namespace", namespace))
	}
	return nil
}

// sameCluster reports whether two clients reach one cluster: the UID of
// kube-system on both, else (one cannot read it) the same API server URL.
func sameCluster(ctx context.Context, a, b *kubeclient.Clients) bool {
	na, errA := a.Typed.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	nb, errB := b.Typed.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if errA == nil && errB == nil {
		return na.UID == nb.UID
	}
	return a.Config != nil && b.Config != nil && strings.TrimSuffix(a.Config.Host, "/") == strings.TrimSuffix(b.Config.Host, "/")
}
