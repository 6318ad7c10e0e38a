package accessaudit_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy/accessaudit"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/relaymesh/relaymesh/translation/worldtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// tagPattern matches an opening tag and captures its element name.
var tagPattern = regexp.MustCompile(`<([a-zA-Z][a-zA-Z0-9]*)[^<>]*>`)

// hostile is an input whose names try to break out of HTML text, attributes
// and the SVG. Offline YAML is not validated by an API server, so names can
// be anything.
func hostile() *translation.Input {
	mesh := common.ObjectRef{Name: "m<script>alert(1)</script>", Namespace: "relaymesh"}
	return &translation.Input{
		Meshes: []discoveryv1alpha1.Mesh{{ObjectMeta: metav1.ObjectMeta{Name: mesh.Name, Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.MeshSpec{Istio: &discoveryv1alpha1.IstioMesh{
				Installation: discoveryv1alpha1.MeshInstallation{Namespace: "istio-system", Cluster: "c\"><img src=x onerror=alert(1)>"},
				TrustDomain:  "td'><script>alert(2)</script>"}}}},
		Workloads: []discoveryv1alpha1.Workload{{ObjectMeta: metav1.ObjectMeta{Name: "w</title><script>alert(3)</script>", Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.WorkloadSpec{Mesh: mesh, Kubernetes: discoveryv1alpha1.KubernetesWorkload{
				Controller:         common.ClusterObjectRef{Name: "x", Namespace: "ns\"onmouseover=\"alert(4)", ClusterName: "c\"><img src=x onerror=alert(1)>"},
				ServiceAccountName: "<svg onload=alert(5)>"}}}},
		Destinations: []discoveryv1alpha1.Destination{{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "relaymesh"},
			Spec: discoveryv1alpha1.DestinationSpec{Mesh: mesh, KubeService: discoveryv1alpha1.KubeService{
				Ref:   common.ClusterObjectRef{Name: "</text></svg><script>alert(6)</script>", Namespace: "ns", ClusterName: "c\"><img src=x onerror=alert(1)>"},
				Ports: []discoveryv1alpha1.ServicePort{{Port: 80, Name: "http"}}}}}},
		AccessPolicies: []networkingv1alpha1.AccessPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "p<b>bold</b>", Namespace: "relaymesh",
			// Allow-all needs the opt-in, or admission refuses it.
			Annotations: map[string]string{"relaymesh.io/allow-all": "true"}},
			Spec: networkingv1alpha1.AccessPolicySpec{AllowedPaths: []string{"/<script>alert(7)</script>"}}}},
	}
}

// TestHTMLEscapesNames: no name reaches the page as markup, and the page
// loads nothing from elsewhere.
func TestHTMLEscapesNames(t *testing.T) {
	r, err := accessaudit.Audit(t.Context(), hostile(), auditConfig(t, admin))
	require.NoError(t, err)
	require.NotEmpty(t, r.Matrix.Pairs)
	require.NotEmpty(t, r.Findings)
	before, err := accessaudit.Audit(t.Context(), &translation.Input{}, auditConfig(t, admin))
	require.NoError(t, err)

	var page, diff bytes.Buffer
	require.NoError(t, accessaudit.WriteHTML(&page, r))
	require.NoError(t, accessaudit.WriteDiffHTML(&diff, accessaudit.Compare(before, r)))
	allowed := map[string]bool{}
	for _, e := range strings.Fields("html head meta title style body h1 h2 p div ul li span svg defs pattern rect path text table thead tbody tr th td code") {
		allowed[e] = true
	}
	for name, b := range map[string]string{"page": page.String(), "diff": diff.String()} {
		// Every tag on the page is one of the template's, with none of the
		// attributes that load or run something.
		for _, tag := range tagPattern.FindAllStringSubmatch(b, -1) {
			assert.True(t, allowed[strings.ToLower(tag[1])], "%s: unexpected element in %s", name, tag[0])
			assert.NotRegexp(t, `(?i)\s(src|href|on[a-z]+)\s*=`, tag[0], name)
		}
		assert.NotContains(t, b, "@import", name)
		assert.NotContains(t, b, "url(http", name)
		assert.Equal(t, 1, strings.Count(b, "<svg"), "%s: one picture", name)
		assert.Contains(t, b, "&lt;script&gt;alert(", name)
		assert.Contains(t, b, "<rect", name)
	}
}

// TestHTMLBoundsThePicture: a matrix larger than MaxGrid rows or columns is
// drawn in part, and the page says so.
func TestHTMLBoundsThePicture(t *testing.T) {
	r, err := accessaudit.Audit(t.Context(), worldtest.New(t, worldtest.Access(4, accessaudit.MaxGrid+20, 40)), auditConfig(t, admin))
	require.NoError(t, err)
	require.Greater(t, len(r.Matrix.Sources), accessaudit.MaxGrid)
	var page bytes.Buffer
	require.NoError(t, accessaudit.WriteHTML(&page, r))
	assert.Contains(t, page.String(), "The picture shows the first 300 of 320 sources and 300 of 320 destination ports")
	assert.LessOrEqual(t, strings.Count(page.String(), "<text "), 2*accessaudit.MaxGrid)
}

func TestTableWithoutPairs(t *testing.T) {
	r, err := accessaudit.Audit(t.Context(), &translation.Input{}, auditConfig(t, admin))
	require.NoError(t, err)
	var b bytes.Buffer
	require.NoError(t, accessaudit.WriteTable(&b, r))
	assert.Equal(t, "ACCESS MATRIX: 0 allowed pairs (0 open) between 0 source identities and 0 destinations\n\nFINDINGS: 0\n", b.String())

	b.Reset()
	require.NoError(t, accessaudit.WriteDiffTable(&b, accessaudit.Compare(r, r)))
	assert.Equal(t, "ACCESS CHANGES: 0 added, 0 removed, 0 changed\n\nFINDINGS ADDED: 0\n\nFINDINGS RESOLVED: 0\n", b.String())
}
