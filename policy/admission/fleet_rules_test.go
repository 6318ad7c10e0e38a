package admission_test

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/relaymesh/relaymesh/policy/admission"
)

// fleetRuleSets are n user rule sets shaped like those a platform team
// writes for a fleet: 40% judge one kind (10% each of TrafficPolicy,
// AccessPolicy, VirtualMesh and VirtualDestination), 40% are one team's rules
// for its own namespace, 20% judge every kind. Their conditions mix what
// OPA's rule index can decide from the input (equalities) with what it
// cannot (comparisons, negations, iteration). fleetRequests are allowed by
// all of them.
func fleetRuleSets(n int) []admission.RuleSet {
	return ruleSets(n, "fleet", func(i int) (string, string) {
		switch k := i % 10; {
		case k == 0:
			return trafficRule(i)
		case k == 1:
			return accessRule(i)
		case k == 2:
			return meshRule(i)
		case k == 3:
			return destinationRule(i)
		case k < 8:
			return teamRule(i)
		default:
			return everyKindRule(i)
		}
	})
}

// everyObjectRuleSets are n rule sets that judge every object with rules
// neither OPA's index nor a guard can leave out (an owner label that must be
// set, a name at most so long): the worst case, where every decision
// evaluates every package.
func everyObjectRuleSets(n int) []admission.RuleSet {
	return ruleSets(n, "every", func(i int) (string, string) { return everyKindRule(10*(i%2) + i/2%10) })
}

// ruleSets are n rule sets relaymesh/<prefix>-NNN of one package
// relaymesh.admission.<prefix>_NNN each, whose rules and tests are rule(NNN).
func ruleSets(n int, prefix string, rule func(i int) (body, tests string)) []admission.RuleSet {
	out := make([]admission.RuleSet, n)
	for i := range out {
		body, tests := rule(i)
		// Test inputs are completed with base: what every real input has.
		tests = testInput.ReplaceAllString(tests, "${1}object.union(base, ${2})")
		out[i] = admission.RuleSet{Name: fmt.Sprintf("relaymesh/%s-%03d", prefix, i), Version: "1", Files: map[string]string{
			"rules.rego": fmt.Sprintf("package relaymesh.admission.%s_%03d\n\n%s\n# Tests.\n\n%s\n%s", prefix, i, body, testBase, tests),
		}}
	}
	return out
}

// testInput is one test's input, testBase what it is completed with.
var testInput = regexp.MustCompile(`(?m)^(\tcount\(deny\) == \d+ with input as )(\{.*\})$`)

const testBase = `base := {
	"operation": "CREATE", "kind": "Other", "namespace": "ns", "name": "n",
	"user": {"username": "u", "groups": []}, "namespaceLabels": {},
}
`

func trafficRule(i int) (string, string) {
	switch (i / 10) % 4 {
	case 0:
		return fmt.Sprintf(`deny contains msg if {
	input.kind == "TrafficPolicy"
	n := input.object.spec.policy.retries.attempts
	n > %[1]d
	msg := sprintf("TrafficPolicy %%s/%%s retries %%d times, at most %[1]d", [input.namespace, input.name, n])
}
`, 5+i%3), `test_many_retries if {
	count(deny) == 1 with input as {"kind": "TrafficPolicy", "object": {"spec": {"policy": {"retries": {"attempts": 50}}}}}
}

test_other_kind if {
	count(deny) == 0 with input as {"kind": "AccessPolicy", "object": {"spec": {"policy": {"retries": {"attempts": 50}}}}}
}
`
	case 1:
		return fmt.Sprintf(`deny contains msg if {
	input.kind == "TrafficPolicy"
	timeout := input.object.spec.policy.requestTimeout
	time.parse_duration_ns(timeout) > %[1]d * 1000000000
	msg := sprintf("TrafficPolicy %%s/%%s waits %%s, at most %[1]ds", [input.namespace, input.name, timeout])
}
`, 30+i%7), `test_long_timeout if {
	count(deny) == 1 with input as {"kind": "TrafficPolicy", "object": {"spec": {"policy": {"requestTimeout": "10m"}}}}
}

test_short_timeout if {
	count(deny) == 0 with input as {"kind": "TrafficPolicy", "object": {"spec": {"policy": {"requestTimeout": "1s"}}}}
}
`
	case 2:
		return `deny contains msg if {
	input.kind == "TrafficPolicy"
	some origin in input.object.spec.policy.corsPolicy.allowOrigins
	origin.exact == "*"
	msg := sprintf("TrafficPolicy %s/%s allows every origin", [input.namespace, input.name])
}
`, `test_any_origin if {
	count(deny) == 1 with input as {"kind": "TrafficPolicy", "object": {"spec": {"policy": {"corsPolicy": {"allowOrigins": [{"exact": "*"}]}}}}}
}

test_one_origin if {
	count(deny) == 0 with input as {"kind": "TrafficPolicy", "object": {"spec": {"policy": {"corsPolicy": {"allowOrigins": [{"exact": "a.example"}]}}}}}
}
`
	default:
		return fmt.Sprintf(`deny contains msg if {
	input.kind == "TrafficPolicy"
	mirror := input.object.spec.policy.mirror
	mirror.percentage > %[1]d
	msg := sprintf("TrafficPolicy %%s/%%s mirrors %%v%%%% of requests, at most %[1]d%%%%", [input.namespace, input.name, mirror.percentage])
}
`, 10+i%5), `test_mirror_all if {
	count(deny) == 1 with input as {"kind": "TrafficPolicy", "object": {"spec": {"policy": {"mirror": {"percentage": 100}}}}}
}

test_no_mirror if {
	count(deny) == 0 with input as {"kind": "TrafficPolicy", "object": {"spec": {"policy": {}}}}
}
`
	}
}

func accessRule(i int) (string, string) {
	switch (i / 10) % 3 {
	case 0:
		method := []string{"DELETE", "CONNECT", "TRACE", "PATCH"}[i%4]
		return fmt.Sprintf(`deny contains msg if {
	input.kind == "AccessPolicy"
	some method in input.object.spec.allowedMethods
	method == %[1]q
	msg := sprintf("AccessPolicy %%s/%%s allows %[1]s", [input.namespace, input.name])
}
`, method), fmt.Sprintf(`test_method if {
	count(deny) == 1 with input as {"kind": "AccessPolicy", "object": {"spec": {"allowedMethods": ["GET", %[1]q]}}}
}

test_other_methods if {
	count(deny) == 0 with input as {"kind": "AccessPolicy", "object": {"spec": {"allowedMethods": ["GET"]}}}
}
`, method)
	case 1:
		port := []int{22, 23, 3389, 5432}[i%4]
		return fmt.Sprintf(`deny contains msg if {
	input.kind == "AccessPolicy"
	%[1]d in input.object.spec.allowedPorts
	msg := sprintf("AccessPolicy %%s/%%s opens port %[1]d", [input.namespace, input.name])
}
`, port), fmt.Sprintf(`test_port if {
	count(deny) == 1 with input as {"kind": "AccessPolicy", "object": {"spec": {"allowedPorts": [80, %[1]d]}}}
}

test_other_ports if {
	count(deny) == 0 with input as {"kind": "AccessPolicy", "object": {"spec": {"allowedPorts": [80]}}}
}
`, port)
	default:
		return `deny contains msg if {
	input.kind == "AccessPolicy"
	some selector in input.object.spec.sourceSelector
	"kube-system" in selector.kubeIdentityMatcher.namespaces
	msg := sprintf("AccessPolicy %s/%s admits kube-system", [input.namespace, input.name])
}
`, `test_kube_system if {
	count(deny) == 1 with input as {"kind": "AccessPolicy", "object": {"spec": {"sourceSelector": [{"kubeIdentityMatcher": {"namespaces": ["kube-system"]}}]}}}
}

test_team if {
	count(deny) == 0 with input as {"kind": "AccessPolicy", "object": {"spec": {"sourceSelector": [{"kubeIdentityMatcher": {"namespaces": ["team-a"]}}]}}}
}
`
	}
}

func meshRule(i int) (string, string) {
	switch (i / 10) % 3 {
	case 0:
		return `deny contains msg if {
	input.kind == "VirtualMesh"
	input.operation in {"CREATE", "UPDATE"}
	not input.object.spec.mtls.strictMTLS
	msg := sprintf("VirtualMesh %s/%s must set spec.mtls.strictMTLS", [input.namespace, input.name])
}
`, `test_not_strict if {
	count(deny) == 1 with input as {"kind": "VirtualMesh", "operation": "CREATE", "object": {"spec": {"mtls": {}}}}
}

test_strict if {
	count(deny) == 0 with input as {"kind": "VirtualMesh", "operation": "CREATE", "object": {"spec": {"mtls": {"strictMTLS": true}}}}
}
`
	case 1:
		return fmt.Sprintf(`deny contains msg if {
	input.kind == "VirtualMesh"
	count(input.object.spec.meshes) > %[1]d
	msg := sprintf("VirtualMesh %%s/%%s joins more than %[1]d meshes", [input.namespace, input.name])
}
`, 20+i%10), `test_too_many if {
	count(deny) == 1 with input as {"kind": "VirtualMesh", "object": {"spec": {"meshes": numbers.range(1, 40)}}}
}

test_few if {
	count(deny) == 0 with input as {"kind": "VirtualMesh", "object": {"spec": {"meshes": [1, 2]}}}
}
`
	default:
		return `deny contains msg if {
	input.kind == "VirtualMesh"
	suffix := input.object.spec.federation.hostnameSuffix
	not endswith(suffix, ".global")
	msg := sprintf("VirtualMesh %s/%s federates under %s, not below .global", [input.namespace, input.name, suffix])
}
`, `test_bad_suffix if {
	count(deny) == 1 with input as {"kind": "VirtualMesh", "object": {"spec": {"federation": {"hostnameSuffix": "example.com"}}}}
}

test_global if {
	count(deny) == 0 with input as {"kind": "VirtualMesh", "object": {"spec": {"federation": {"hostnameSuffix": "fleet.global"}}}}
}
`
	}
}

func destinationRule(i int) (string, string) {
	switch (i / 10) % 3 {
	case 0:
		return `deny contains msg if {
	input.kind == "VirtualDestination"
	not endswith(input.object.spec.hostname, ".global")
	msg := sprintf("VirtualDestination %s/%s: hostname must end in .global", [input.namespace, input.name])
}
`, `test_local_name if {
	count(deny) == 1 with input as {"kind": "VirtualDestination", "object": {"spec": {"hostname": "a.example"}}}
}

test_global_name if {
	count(deny) == 0 with input as {"kind": "VirtualDestination", "object": {"spec": {"hostname": "a.global"}}}
}
`
	case 1:
		return fmt.Sprintf(`deny contains msg if {
	input.kind == "VirtualDestination"
	port := input.object.spec.port.number
	port < %[1]d
	msg := sprintf("VirtualDestination %%s/%%s uses privileged port %%d", [input.namespace, input.name, port])
}
`, 1024-i%3), `test_privileged if {
	count(deny) == 1 with input as {"kind": "VirtualDestination", "object": {"spec": {"port": {"number": 80}}}}
}

test_unprivileged if {
	count(deny) == 0 with input as {"kind": "VirtualDestination", "object": {"spec": {"port": {"number": 8080}}}}
}
`
	default:
		return `protocols := {"http", "http2", "grpc", "tcp"}

deny contains msg if {
	input.kind == "VirtualDestination"
	protocol := input.object.spec.port.protocol
	not protocol in protocols
	msg := sprintf("VirtualDestination %s/%s: protocol %s is not one of %v", [input.namespace, input.name, protocol, sort(protocols)])
}
`, `test_odd_protocol if {
	count(deny) == 1 with input as {"kind": "VirtualDestination", "object": {"spec": {"port": {"protocol": "mongo"}}}}
}

test_http if {
	count(deny) == 0 with input as {"kind": "VirtualDestination", "object": {"spec": {"port": {"protocol": "http"}}}}
}
`
	}
}

// teamRule: only members of team-NN may write in namespace team-NN, and
// not in its frozen week.
func teamRule(i int) (string, string) {
	return fmt.Sprintf(`team := "team-%02[1]d"

deny contains msg if {
	input.namespace == team
	input.operation in {"CREATE", "UPDATE", "DELETE"}
	not team in input.user.groups
	msg := sprintf("%%s %%s/%%s: %%s is not in group %%s", [input.kind, input.namespace, input.name, input.user.username, team])
}

deny contains msg if {
	input.namespace == team
	input.namespaceLabels["relaymesh.io/frozen"] == "true"
	msg := sprintf("%%s %%s/%%s: namespace %%s is frozen", [input.kind, input.namespace, input.name, team])
}
`, i%40), fmt.Sprintf(`test_outsider if {
	count(deny) == 1 with input as {"namespace": "team-%02[1]d", "operation": "CREATE", "user": {"username": "eve", "groups": []}}
}

test_member if {
	count(deny) == 0 with input as {"namespace": "team-%02[1]d", "operation": "CREATE", "user": {"username": "bob", "groups": ["team-%02[1]d"]}}
}

test_other_namespace if {
	count(deny) == 0 with input as {"namespace": "elsewhere", "operation": "CREATE", "user": {"username": "eve", "groups": []}}
}
`, i%40)
}

// everyKindRule judges objects of every kind.
func everyKindRule(i int) (string, string) {
	switch (i / 10) % 4 {
	case 0:
		return `deny contains msg if {
	input.operation in {"CREATE", "UPDATE"}
	not input.object.metadata.labels["relaymesh.io/owner"]
	msg := sprintf("%s %s/%s has no relaymesh.io/owner label", [input.kind, input.namespace, input.name])
}
`, `test_no_owner if {
	count(deny) == 1 with input as {"operation": "CREATE", "object": {"metadata": {}}}
}

test_owner if {
	count(deny) == 0 with input as {"operation": "CREATE", "object": {"metadata": {"labels": {"relaymesh.io/owner": "a"}}}}
}
`
	case 1:
		return fmt.Sprintf(`deny contains msg if {
	count(input.name) > %[1]d
	msg := sprintf("%%s %%s/%%s: names are at most %[1]d characters", [input.kind, input.namespace, substring(input.name, 0, %[1]d)])
}
`, 50+i%10), fmt.Sprintf(`test_long_name if {
	count(deny) == 1 with input as {"name": %q, "kind": "x", "namespace": "y"}
}
`, strings.Repeat("n", 70)) + `
test_short_name if {
	count(deny) == 0 with input as {"name": "short"}
}
`
	case 2:
		return `deny contains msg if {
	input.operation == "DELETE"
	input.oldObject.metadata.annotations["relaymesh.io/protected"] == "true"
	msg := sprintf("%s %s/%s is protected", [input.kind, input.namespace, input.name])
}
`, `test_protected if {
	count(deny) == 1 with input as {"operation": "DELETE", "oldObject": {"metadata": {"annotations": {"relaymesh.io/protected": "true"}}}}
}

test_unprotected if {
	count(deny) == 0 with input as {"operation": "DELETE", "oldObject": {"metadata": {}}}
}
`
	default:
		return `deny contains msg if {
	input.namespaceLabels["relaymesh.io/environment"] == "production"
	some group in input.user.groups
	startswith(group, "contractors")
	msg := sprintf("%s %s/%s: contractors may not change production", [input.kind, input.namespace, input.name])
}
`, `test_contractor if {
	count(deny) == 1 with input as {"namespaceLabels": {"relaymesh.io/environment": "production"}, "user": {"groups": ["contractors-eu"]}}
}

test_staff if {
	count(deny) == 0 with input as {"namespaceLabels": {"relaymesh.io/environment": "production"}, "user": {"groups": ["staff"]}}
}
`
	}
}

// fleetRequests are one allowed CREATE of each kind, in namespace team-07 by a
// member of team-07, the shape the API server stores after defaulting.
func fleetRequests() []admission.Request {
	meta := func(name string) map[string]any {
		return map[string]any{"name": name, "namespace": "team-07", "uid": "6f1c0a52-1111-4c3b-9a59-2d8f3f2b0c11", "generation": int64(1),
			"labels":      map[string]any{"relaymesh.io/owner": "team-07", "app": "reviews"},
			"annotations": map[string]any{"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"networking.relaymesh.io/v1alpha1"}`}}
	}
	req := func(kind, name string, spec map[string]any) admission.Request {
		return admission.Request{Operation: admission.OperationCreate, Kind: kind, Namespace: "team-07", Name: name,
			Object:          map[string]any{"apiVersion": "networking.relaymesh.io/v1alpha1", "kind": kind, "metadata": meta(name), "spec": spec},
			User:            admission.User{Username: "alice", Groups: []string{"team-07", "system:authenticated"}},
			NamespaceLabels: map[string]string{"relaymesh.io/environment": "staging", "kubernetes.io/metadata.name": "team-07"}}
	}
	destinations := []any{map[string]any{"kubeServiceMatcher": map[string]any{"labels": map[string]any{"app": "reviews"}, "namespaces": []any{"team-07"}}}}
	return []admission.Request{
		req("TrafficPolicy", "reviews-timeouts", map[string]any{
			"destinationSelector": destinations,
			"httpRequestMatchers": []any{map[string]any{"uri": map[string]any{"prefix": "/api"}, "method": "GET"}},
			"policy": map[string]any{
				"requestTimeout": "5s",
				"retries":        map[string]any{"attempts": int64(3), "perTryTimeout": "2s", "retryOn": []any{"5xx", "reset"}},
				"corsPolicy":     map[string]any{"allowOrigins": []any{map[string]any{"exact": "https://shop.example"}}, "allowMethods": []any{"GET"}},
				"mirror":         map[string]any{"kubeService": map[string]any{"name": "reviews-shadow", "namespace": "team-07", "clusterName": "cluster-1"}, "percentage": 5.0},
			},
		}),
		req("AccessPolicy", "reviews-readers", map[string]any{
			"sourceSelector":      []any{map[string]any{"kubeIdentityMatcher": map[string]any{"namespaces": []any{"team-07"}, "clusters": []any{"cluster-1"}}}},
			"destinationSelector": destinations,
			"allowedMethods":      []any{"GET", "HEAD"},
			"allowedPorts":        []any{int64(9080)},
		}),
		req("VirtualMesh", "fleet", map[string]any{
			"meshes": []any{map[string]any{"name": "istiod", "namespace": "istio-system", "clusterName": "cluster-1"},
				map[string]any{"name": "istiod", "namespace": "istio-system", "clusterName": "cluster-2"}},
			"mtls": map[string]any{"strictMTLS": true, "autoRestartPods": true, "rotationStrategy": "Staged",
				"shared": map[string]any{"rootCA": map[string]any{"generated": map[string]any{"keyAlgorithm": "ECDSAP256", "ttl": "87600h"}}}},
			"federation": map[string]any{"hostnameSuffix": "fleet.global", "selectors": []any{map[string]any{"namespaces": []any{"team-07"}}}},
		}),
		req("VirtualDestination", "reviews-global", map[string]any{
			"hostname": "reviews.team-07.global",
			"port":     map[string]any{"number": int64(9080), "protocol": "http", "targetName": "http"},
			"localized": map[string]any{"destinationSelectors": destinations,
				"failoverDirectives": []any{map[string]any{"from": map[string]any{"region": "eu-west-1"}, "to": []any{map[string]any{"region": "eu-central-1"}}}}},
		}),
	}
}
