package dashboard

import (
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	multiclusterv1alpha1 "github.com/relaymesh/relaymesh/api/multicluster/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// AuditLogGroup and AuditLogResource name what a caller must be allowed to
// get (in the server's namespace) to read the audit log: it is no
// Kubernetes object, so the dashboard asks about a resource of the
// relaymesh.io group, as the /debug endpoints do.
const (
	AuditLogGroup    = "relaymesh.io"
	AuditLogResource = "auditlogs"
)

// View names a page of the dashboard (and its JSON form under /api/v1/).
type View string

// The views.
const (
	ViewFleet        View = "fleet"
	ViewCertificates View = "certificates"
	ViewTrust        View = "trust"
	ViewPolicies     View = "policies"
	ViewAccess       View = "access"
	ViewAudit        View = "audit"
)

// AllViews in the order the navigation shows them.
var AllViews = []View{ViewFleet, ViewCertificates, ViewTrust, ViewPolicies, ViewAccess, ViewAudit}

// Title is the view's name in the navigation.
func (v View) Title() string {
	switch v {
	case ViewFleet:
		return "Fleet"
	case ViewCertificates:
		return "Certificates"
	case ViewTrust:
		return "Trust"
	case ViewPolicies:
		return "Policies"
	case ViewAccess:
		return "Access"
	case ViewAudit:
		return "Audit log"
	}
	return string(v)
}

// need is one permission a view needs: a verb on a resource of a group,
// in the server's namespace (namespaced) or in every namespace.
type need struct {
	verb, group, resource string
	namespaced            bool
}

var (
	listClusters     = need{"list", multiclusterv1alpha1.GroupVersion.Group, multiclusterv1alpha1.KubernetesClusters.Resource, true}
	listVirtualMesh  = need{"list", networkingv1alpha1.GroupVersion.Group, networkingv1alpha1.VirtualMeshes.Resource, false}
	listTraffic      = need{"list", networkingv1alpha1.GroupVersion.Group, networkingv1alpha1.TrafficPolicies.Resource, false}
	listAccess       = need{"list", networkingv1alpha1.GroupVersion.Group, networkingv1alpha1.AccessPolicies.Resource, false}
	listVirtualDests = need{"list", networkingv1alpha1.GroupVersion.Group, networkingv1alpha1.VirtualDestinations.Resource, false}
	listMeshes       = need{"list", discoveryv1alpha1.GroupVersion.Group, "meshes", true}
	listWorkloads    = need{"list", discoveryv1alpha1.GroupVersion.Group, "workloads", true}
	listDestinations = need{"list", discoveryv1alpha1.GroupVersion.Group, "destinations", true}
	getAuditLog      = need{"get", AuditLogGroup, AuditLogResource, true}
	listPeers        = need{"list", networkingv1alpha1.GroupVersion.Group, networkingv1alpha1.FederatedTrustDomains.Resource, true}
)

// needs are what each view shows, as permissions: a caller must be allowed
// every one (SubjectAccessReview) to see it. Policies and the access matrix
// span every namespace, so their kinds need cluster-wide list.
var needs = map[View][]need{
	ViewFleet:        {listClusters},
	ViewCertificates: {listClusters, listVirtualMesh},
	ViewTrust:        {listClusters, listVirtualMesh},
	ViewPolicies:     {listVirtualMesh, listTraffic, listAccess, listVirtualDests},
	ViewAccess:       {listVirtualMesh, listTraffic, listAccess, listVirtualDests, listMeshes, listWorkloads, listDestinations},
	ViewAudit:        {getAuditLog},
}

// Section names a part of a view that needs more than the view: a caller
// allowed the view but not the section gets the view with the section
// saying what it needs, and none of its data.
type Section string

// The sections.
const (
	// SectionFederationPeers is the Trust page's FederatedTrustDomains.
	SectionFederationPeers Section = "federation-peers"
)

// sectionNeeds are what each section shows, as permissions, beyond its
// view's; sections are each view's.
var (
	sectionNeeds = map[Section][]need{SectionFederationPeers: {listPeers}}
	sections     = map[View][]Section{ViewTrust: {SectionFederationPeers}}
)

// Attributes are the SubjectAccessReview attributes a caller must be
// allowed for view v, with namespace the server's.
func Attributes(v View, namespace string) []authorizationv1.ResourceAttributes {
	return attributes(needs[v], namespace)
}

// SectionAttributes are the SubjectAccessReview attributes a caller must
// be allowed, beyond its view's, to see section s.
func SectionAttributes(s Section, namespace string) []authorizationv1.ResourceAttributes {
	return attributes(sectionNeeds[s], namespace)
}

func attributes(ns []need, namespace string) []authorizationv1.ResourceAttributes {
	var out []authorizationv1.ResourceAttributes
	for _, n := range ns {
		a := authorizationv1.ResourceAttributes{Verb: n.verb, Group: n.group, Resource: n.resource}
		if n.namespaced {
			a.Namespace = namespace
		}
		out = append(out, a)
	}
	return out
}

// ViewerRules are the rules of a ClusterRole that lets its subjects see
// every view (the server chart's <release>-dashboard-viewer, which test
// compares with these): list on the Relaymesh kinds (the
// FederatedTrustDomains too, for the Trust page's federation peers) and get
// on the audit log. Bound with a RoleBinding in the server's namespace
// instead, it grants Fleet and the Audit log only (the other views span
// namespaces).
func ViewerRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{multiclusterv1alpha1.GroupVersion.Group}, Resources: []string{multiclusterv1alpha1.KubernetesClusters.Resource}, Verbs: []string{"list"}},
		{APIGroups: []string{networkingv1alpha1.GroupVersion.Group}, Resources: append(networkingv1alpha1.Resources(), networkingv1alpha1.FederatedTrustDomains.Resource), Verbs: []string{"list"}},
		{APIGroups: []string{discoveryv1alpha1.GroupVersion.Group}, Resources: []string{"meshes", "workloads", "destinations"}, Verbs: []string{"list"}},
		{APIGroups: []string{AuditLogGroup}, Resources: []string{AuditLogResource}, Verbs: []string{"get"}},
	}
}
