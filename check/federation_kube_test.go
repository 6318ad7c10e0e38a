package check

import (
	"context"
	"strings"
	"testing"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/internal/kubeclient"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
)

// Gather lists the FederatedTrustDomains of the server's namespace on a
// real apiserver, status as the importer writes it, and none of another
// namespace's; a run that may not list them, and a cluster without the
// CRD, are each one warning that says they were not checked.
func TestGatherFederatedTrustDomainsFromAPIServer(t *testing.T) {
	ctx := context.Background()
	const ns = "relaymesh"
	cfg, mgmt, kube, dyn := gatherFromManagement(t, ns)
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "elsewhere"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	start := time.Now()
	fetched := metav1.NewTime(start.Add(-time.Minute).Truncate(time.Second))
	create := func(namespace, name string, st networkingv1alpha1.FederatedTrustDomainStatus) {
		t.Helper()
		f := &networkingv1alpha1.FederatedTrustDomain{TypeMeta: metav1.TypeMeta{APIVersion: networkingv1alpha1.GroupVersion.String(), Kind: "FederatedTrustDomain"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec:       networkingv1alpha1.FederatedTrustDomainSpec{TrustDomain: name + ".example", BundleEndpointURL: "https://" + name + ".example:8443", Profile: "https_web"}}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(f)
		require.NoError(t, err)
		created, err := dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(namespace).Create(ctx, &unstructured.Unstructured{Object: u}, metav1.CreateOptions{})
		require.NoError(t, err)
		if st.State == "" {
			return
		}
		status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
		require.NoError(t, err)
		created.Object["status"] = status
		_, err = dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	create(ns, "spire", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedCurrent, LastFetch: &fetched, LastAccepted: &fetched,
		Sequence: 3, RefreshHint: 300, Roots: []networkingv1alpha1.FederatedRoot{{Fingerprint: strings.Repeat("c0", 32), Subject: "O=SPIRE", NotAfter: metav1.NewTime(start.Add(72 * time.Hour).Truncate(time.Second))}}})
	create(ns, "broken", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedInvalid, LastFetch: &fetched,
		Error: "trust domain \"broken.example\" is granted to cluster east\n\x1b[31mFAKE"})
	create(ns, "new", networkingv1alpha1.FederatedTrustDomainStatus{})
	create("elsewhere", "ignored", networkingv1alpha1.FederatedTrustDomainStatus{State: networkingv1alpha1.FederatedInvalid, Error: "not the server's namespace"})

	o := Gather(ctx, cfg)
	require.NoError(t, o.FederatedTrustDomainsErr)
	names := []string{}
	for _, f := range o.FederatedTrustDomains {
		names = append(names, f.Namespace+"/"+f.Name)
	}
	assert.ElementsMatch(t, []string{ns + "/spire", ns + "/broken", ns + "/new"}, names, "only the server's namespace counts")
	rs := Evaluate(o, time.Now())
	spire := find(rs, AreaFederation, ns+"/spire")
	require.Len(t, spire, 2, "the state and the root expiring in 3 days")
	sev, msg := worst(spire)
	assert.Equal(t, Warning, sev, msg)
	assert.Contains(t, msg, "trust domain spire.example: bundle current, sequence 3, 1 root(s)")
	assert.Contains(t, msg, "root c0c0c0c0c0c0c0c0… (O=SPIRE) of trust domain spire.example expires in")
	broken := find(rs, AreaFederation, ns+"/broken")
	require.Len(t, broken, 1)
	assert.Equal(t, Error, broken[0].Severity)
	assert.Contains(t, broken[0].Message, `trust domain broken.example is Invalid: trust domain "broken.example" is granted to cluster east  [31mFAKE`)
	fresh := find(rs, AreaFederation, ns+"/new")
	require.Len(t, fresh, 1)
	assert.Equal(t, Warning, fresh[0].Severity)
	assert.Contains(t, fresh[0].Message, "has never been fetched")
	assert.Empty(t, find(rs, AreaFederation, "elsewhere/ignored"))

	// A run whose credentials may not list them: Forbidden, said so.
	rc := mgmt.RESTConfig()
	rc.Impersonate = rest.ImpersonationConfig{UserName: "check-without-rbac", Groups: []string{"system:authenticated"}}
	nobody, err := kubeclient.NewClients(rc, "mgmt")
	require.NoError(t, err)
	o = Gather(ctx, Config{Mgmt: nobody, Namespace: ns, Timeout: 5 * time.Second})
	require.True(t, apierrors.IsForbidden(o.FederatedTrustDomainsErr), "%v", o.FederatedTrustDomainsErr)
	rs = find(Evaluate(o, time.Now()), AreaFederation, "")
	require.Len(t, rs, 1)
	assert.Equal(t, Warning, rs[0].Severity)
	assert.Contains(t, rs[0].Message, "this run may not list FederatedTrustDomains in relaymesh: imported foreign trust domains not checked")

	// A cluster without the CRD (a server older than the kind): NotFound,
	// said so.
	ext, err := apiextensionsclient.NewForConfig(mgmt.RESTConfig())
	require.NoError(t, err)
	require.NoError(t, ext.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, "federatedtrustdomains."+networkingv1alpha1.GroupVersion.Group, metav1.DeleteOptions{}))
	require.Eventually(t, func() bool {
		_, err := dyn.Resource(networkingv1alpha1.FederatedTrustDomains).Namespace(ns).List(ctx, metav1.ListOptions{})
		return apierrors.IsNotFound(err)
	}, 30*time.Second, 100*time.Millisecond, "the CRD is gone")
	o = Gather(ctx, cfg)
	require.True(t, apierrors.IsNotFound(o.FederatedTrustDomainsErr), "%v", o.FederatedTrustDomainsErr)
	rs = find(Evaluate(o, time.Now()), AreaFederation, "")
	require.Len(t, rs, 1)
	assert.Equal(t, Warning, rs[0].Severity)
	assert.Contains(t, rs[0].Message, "the FederatedTrustDomain CRD is not installed (see crds): imported foreign trust domains not checked")
}
