# Fault injection is refused in production: a TrafficPolicy with
# spec.policy.faultInjection may not be created in (or updated into) a
# namespace labelled relaymesh.io/environment: production. The label is read
# from the policy's own namespace (input.namespaceLabels).
package relaymesh.admission.production_fault_injection

deny contains msg if {
	input.kind == "TrafficPolicy"
	input.operation in {"CREATE", "UPDATE"}
	input.namespaceLabels["relaymesh.io/environment"] == "production"
	input.object.spec.policy.faultInjection != null
	msg := sprintf(
		"TrafficPolicy %s/%s injects faults, which is not allowed in namespace %s (labelled relaymesh.io/environment: production)",
		[input.namespace, input.name, input.namespace],
	)
}

# Tests.

traffic(policy, labels) := {
	"operation": "CREATE",
	"kind": "TrafficPolicy",
	"namespace": "shop",
	"name": "chaos",
	"namespaceLabels": labels,
	"object": {"metadata": {"name": "chaos", "namespace": "shop"}, "spec": {"policy": policy}},
}

production := {"relaymesh.io/environment": "production"}

fault := {"faultInjection": {"abort": {"httpStatus": 503}, "percentage": 10}}

test_fault_in_production_denied if {
	count(deny) == 1 with input as traffic(fault, production)
}

test_fault_update_in_production_denied if {
	count(deny) == 1 with input as object.union(traffic(fault, production), {"operation": "UPDATE"})
}

test_fault_elsewhere_allowed if {
	count(deny) == 0 with input as traffic(fault, {"relaymesh.io/environment": "staging"})
}

test_fault_without_labels_allowed if {
	count(deny) == 0 with input as traffic(fault, {})
}

test_no_fault_in_production_allowed if {
	count(deny) == 0 with input as traffic({"requestTimeout": "1s"}, production)
}

test_null_fault_allowed if {
	count(deny) == 0 with input as traffic({"faultInjection": null}, production)
}

test_delete_allowed if {
	count(deny) == 0 with input as object.union(traffic(fault, production), {"operation": "DELETE"})
}
