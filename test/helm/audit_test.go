package helm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// auditPolicy records, at Metadata level (never a Secret's content), every
// request of the ServiceAccounts of the relaymesh namespace.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:` + namespace + `"]
- level: None
`

// request is one API request from an audit log.
type request struct {
	user, verb, group, resource, subresource, namespace, name string
	code                                                      int
	at                                                        time.Time
	uri                                                       string
}

func (r request) String() string {
	res := r.resource
	if r.subresource != "" {
		res += "/" + r.subresource
	}
	if r.group != "" {
		res += "." + r.group
	}
	where := r.namespace
	if r.name != "" {
		where += "/" + r.name
	}
	return fmt.Sprintf("%s %s %s %s → %d", strings.TrimPrefix(r.user, "system:serviceaccount:"), r.verb, res, where, r.code)
}

// denied reports whether RBAC (or admission) refused the request.
func (r request) denied() bool { return r.code == 403 }

// readAudit reads the resource requests of an audit log, one per audit ID
// (the last stage seen). A line still being written is ignored.
func readAudit(path string) ([]request, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	type event struct {
		AuditID    string `json:"auditID"`
		Verb       string `json:"verb"`
		RequestURI string `json:"requestURI"`
		User       struct {
			Username string `json:"username"`
		} `json:"user"`
		ObjectRef *struct {
			Resource, Namespace, Name, Subresource string
			APIGroup                               string `json:"apiGroup"`
		} `json:"objectRef"`
		ResponseStatus *struct {
			Code int `json:"code"`
		} `json:"responseStatus"`
		Received time.Time `json:"requestReceivedTimestamp"`
	}
	byID := map[string]int{}
	var out []request
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil || e.ObjectRef == nil {
			continue
		}
		r := request{user: e.User.Username, verb: e.Verb, group: e.ObjectRef.APIGroup, resource: e.ObjectRef.Resource,
			subresource: e.ObjectRef.Subresource, namespace: e.ObjectRef.Namespace, name: e.ObjectRef.Name, at: e.Received, uri: e.RequestURI}
		if e.ResponseStatus != nil {
			r.code = e.ResponseStatus.Code
		}
		if i, ok := byID[e.AuditID]; ok {
			out[i] = r
			continue
		}
		byID[e.AuditID] = len(out)
		out = append(out, r)
	}
	return out, nil
}

// grant is one rule of a chart's Role or ClusterRole, for the account the
// chart binds it to.
type grant struct {
	chart, kind, role, namespace string
	index                        int
	user                         string
	rule                         rbacv1.PolicyRule
}

func (g grant) String() string {
	s := fmt.Sprintf("%s %s rule %d: %s %s", g.chart, g.kind, g.index, strings.Join(g.rule.Resources, ","), strings.Join(g.rule.Verbs, ","))
	if len(g.rule.ResourceNames) > 0 {
		s += " of " + strings.Join(g.rule.ResourceNames, ",")
	}
	return s
}

// grants lists the rules of the Roles and ClusterRoles among a chart's
// objects that the chart binds, to its one ServiceAccount. (A role the
// chart ships for people to bind, such as the server's dashboard viewer,
// grants its account nothing.)
func grants(t testing.TB, chart string, objs []*unstructured.Unstructured) []grant {
	t.Helper()
	sa := find(t, objs, "ServiceAccount")
	user := "system:serviceaccount:" + sa.GetNamespace() + ":" + sa.GetName()
	bound := map[string]bool{}
	for _, o := range objs {
		if k := o.GetKind(); k == "RoleBinding" || k == "ClusterRoleBinding" {
			ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
			kind, _, _ := unstructured.NestedString(o.Object, "roleRef", "kind")
			bound[kind+"/"+ref] = true
		}
	}
	var out []grant
	for _, o := range objs {
		if !bound[o.GetKind()+"/"+o.GetName()] {
			continue
		}
		var rules []rbacv1.PolicyRule
		switch o.GetKind() {
		case "Role":
			rules = convert[rbacv1.Role](t, o).Rules
		case "ClusterRole":
			rules = convert[rbacv1.ClusterRole](t, o).Rules
		default:
			continue
		}
		for i, r := range rules {
			out = append(out, grant{chart: chart, kind: o.GetKind(), role: o.GetName(), namespace: o.GetNamespace(), index: i, user: user, rule: r})
		}
	}
	require.NotEmpty(t, out, "%s grants nothing", chart)
	return out
}

// allows reports whether the rule authorizes r, the way the RBAC
// authorizer decides: a Role's rules only in its namespace; resourceNames
// never match a create (its name is unknown when it is authorized); a list
// or watch names an object through a metadata.name field selector.
func (g grant) allows(r request) bool {
	return r.user == g.user && g.matches(r.verb, r)
}

func (g grant) matches(verb string, r request) bool {
	if g.kind == "Role" && r.namespace != g.namespace {
		return false
	}
	res := r.resource
	if r.subresource != "" {
		res += "/" + r.subresource
	}
	if !has(g.rule.Verbs, verb) || !has(g.rule.APIGroups, r.group) || !has(g.rule.Resources, res) {
		return false
	}
	if len(g.rule.ResourceNames) == 0 {
		return true
	}
	return verb != "create" && verb != "deletecollection" && r.name != "" && slices.Contains(g.rule.ResourceNames, r.name)
}

func has(list []string, v string) bool { return slices.Contains(list, v) || slices.Contains(list, "*") }

// atom is one permission a rule grants: a verb on a resource (of a name).
type atom struct{ verb, group, resource, name string }

func (a atom) String() string {
	s := a.verb + " " + a.resource
	if a.group != "" {
		s += "." + a.group
	}
	if a.name != "" {
		s += " " + a.name
	}
	return s
}

func (g grant) atoms() []atom {
	var out []atom
	names := g.rule.ResourceNames
	if len(names) == 0 {
		names = []string{""}
	}
	for _, v := range g.rule.Verbs {
		for _, gr := range g.rule.APIGroups {
			for _, res := range g.rule.Resources {
				for _, n := range names {
					out = append(out, atom{v, gr, res, n})
				}
			}
		}
	}
	return out
}

// uses reports whether an authorized request used the atom. A patch that
// created its object (server-side apply, 201) used create as well: the API
// server authorizes that create too.
func (g grant) uses(a atom, r request) bool {
	if r.user != g.user || r.denied() {
		return false
	}
	one := grant{kind: g.kind, namespace: g.namespace, rule: rbacv1.PolicyRule{Verbs: []string{a.verb}, APIGroups: []string{a.group}, Resources: []string{a.resource}}}
	if a.name != "" {
		one.rule.ResourceNames = []string{a.name}
	}
	if one.matches(r.verb, r) {
		return true
	}
	return r.verb == "patch" && r.code == 201 && one.matches("create", r)
}

// coverage checks the audit of a job that passed: no request of the charts'
// accounts was denied, every authorized resource request is one the charts'
// rules allow, and every verb on every resource (and name) each rule grants
// was used. It returns, for each grant, the first request that used it.
func coverage(t *testing.T, gs []grant, reqs []request) map[int]request {
	t.Helper()
	users := map[string]bool{}
	for _, g := range gs {
		users[g.user] = true
	}
	var denied, unmatched []string
	for _, r := range reqs {
		if !users[r.user] {
			continue
		}
		if r.denied() {
			denied = append(denied, r.String())
			continue
		}
		if !slices.ContainsFunc(gs, func(g grant) bool { return g.allows(r) || g.uses(atom{"create", r.group, r.resource, ""}, r) }) {
			unmatched = append(unmatched, r.String())
		}
	}
	require.Empty(t, denied, "requests of the charts' accounts denied during the job (the charts lack a permission)")
	require.Empty(t, uniq(unmatched), "requests authorized by something other than the charts' rules")

	first := map[int]request{}
	var unused, exemptUsed []string
	for i, g := range gs {
		for _, a := range g.atoms() {
			j := slices.IndexFunc(reqs, func(r request) bool { return g.uses(a, r) })
			if _, exempt := notInTheJob[a.group]; exempt {
				if j >= 0 {
					exemptUsed = append(exemptUsed, g.String()+": "+a.String())
				}
				continue
			}
			if j < 0 {
				unused = append(unused, g.String()+": "+a.String())
				continue
			}
			if f, ok := first[i]; !ok || reqs[j].at.Before(f.at) {
				first[i] = reqs[j]
			}
		}
	}
	require.Empty(t, unused, "permissions the charts grant that the main job never used")
	require.Empty(t, exemptUsed, "permissions notInTheJob exempts that the main job now uses: remove their exemption")
	return first
}

// notInTheJob are the API groups whose permissions the main job cannot use
// yet, each with why and what proves them instead. coverage fails when the
// job does use one, so an exemption does not outlive its reason.
var notInTheJob = map[string]string{}

func uniq(s []string) []string {
	sort.Strings(s)
	return slices.Compact(s)
}
