# An AccessPolicy that lets every source reach every destination must say so
# with the annotation relaymesh.io/allow-all: "true".
#
# A side selects everything when its selector list is missing or empty, or
# when one of its selectors restricts nothing: a matcher with no namespaces,
# clusters or labels, or an entry with no matcher, references or SPIFFE IDs.
package relaymesh.admission.access_allow_all

deny contains msg if {
	input.kind == "AccessPolicy"
	input.operation in {"CREATE", "UPDATE"}
	selects_all_sources(input.object)
	selects_all_destinations(input.object)
	not opted_in
	msg := sprintf(
		"AccessPolicy %s/%s lets every source reach every destination; add the annotation relaymesh.io/allow-all: \"true\" if that is intended",
		[input.namespace, input.name],
	)
}

opted_in if input.object.metadata.annotations["relaymesh.io/allow-all"] == "true"

# Arguments are never undefined (OPA evaluates a function's arguments
# outside of a surrounding "not"): get returns null for what is missing.
selects_all_sources(obj) if not has_entries(get(obj, "spec"), "sourceSelector")

selects_all_sources(obj) if {
	some sel in get(get(obj, "spec"), "sourceSelector")
	open_identity_selector(sel)
}

selects_all_destinations(obj) if not has_entries(get(obj, "spec"), "destinationSelector")

selects_all_destinations(obj) if {
	some sel in get(get(obj, "spec"), "destinationSelector")
	open_destination_selector(sel)
}

identity_fields := {"namespaces", "clusters"}

destination_fields := {"namespaces", "clusters", "labels"}

# A selector selects everyone when its matcher restricts nothing and is set,
# or restricts nothing and no references are listed either. (An entry with
# neither matches nothing in translation, but the API refuses it; it is
# treated as open here, to fail closed.)
open_identity_selector(sel) if {
	is_object(get(sel, "kubeIdentityMatcher"))
	not restricts(get(sel, "kubeIdentityMatcher"), identity_fields)
}

open_identity_selector(sel) if {
	not restricts(get(sel, "kubeIdentityMatcher"), identity_fields)
	not has_entries(get(sel, "kubeServiceAccountRefs"), "serviceAccounts")
	not has_entries(sel, "spiffeIDs")
}

open_destination_selector(sel) if {
	is_object(get(sel, "kubeServiceMatcher"))
	not restricts(get(sel, "kubeServiceMatcher"), destination_fields)
}

open_destination_selector(sel) if {
	not restricts(get(sel, "kubeServiceMatcher"), destination_fields)
	not has_entries(get(sel, "kubeServiceRefs"), "services")
}

# restricts: matcher sets at least one of fields to a non-empty list or map.
restricts(matcher, fields) if {
	some field in fields
	not_empty(get(matcher, field))
}

# has_entries: obj[key] is a non-empty list. Missing, null and [] are not.
has_entries(obj, key) if {
	is_array(get(obj, key))
	count(get(obj, key)) > 0
}

not_empty(value) if {
	is_array(value)
	count(value) > 0
}

not_empty(value) if {
	is_object(value)
	count(value) > 0
}

# get is obj[key], or null when obj is not an object or has no key.
get(obj, key) := object.get(obj, key, null) if {
	is_object(obj)
} else := null

# Tests.

policy(spec, annotations) := {
	"operation": "CREATE",
	"kind": "AccessPolicy",
	"namespace": "team-a",
	"name": "p",
	"object": {"metadata": {"name": "p", "namespace": "team-a", "annotations": annotations}, "spec": spec},
}

some_sources := [{"kubeIdentityMatcher": {"namespaces": ["team-a"]}}]

some_destinations := [{"kubeServiceMatcher": {"labels": {"app": "reviews"}}}]

test_no_selectors_denied if {
	count(deny) == 1 with input as policy({}, {})
}

test_empty_lists_denied if {
	count(deny) == 1 with input as policy({"sourceSelector": [], "destinationSelector": null}, {})
}

test_open_matchers_denied if {
	spec := {
		"sourceSelector": [{"kubeIdentityMatcher": {}}],
		"destinationSelector": [{"kubeServiceMatcher": {"namespaces": [], "labels": {}}}],
	}
	count(deny) == 1 with input as policy(spec, {})
}

test_one_open_selector_among_several_denied if {
	spec := {
		"sourceSelector": array.concat(some_sources, [{"kubeIdentityMatcher": {"clusters": []}}]),
		"destinationSelector": [{}],
	}
	count(deny) == 1 with input as policy(spec, {})
}

test_annotation_allows if {
	count(deny) == 0 with input as policy({}, {"relaymesh.io/allow-all": "true"})
}

test_annotation_must_be_true if {
	count(deny) == 1 with input as policy({}, {"relaymesh.io/allow-all": "yes"})
}

test_restricted_sources_allowed if {
	count(deny) == 0 with input as policy({"sourceSelector": some_sources}, {})
}

test_restricted_destinations_allowed if {
	count(deny) == 0 with input as policy({"destinationSelector": some_destinations}, {})
}

test_service_account_refs_allowed if {
	spec := {"sourceSelector": [{"kubeServiceAccountRefs": {"serviceAccounts": [{"name": "a", "namespace": "b", "clusterName": "c"}]}}]}
	count(deny) == 0 with input as policy(spec, {})
}

test_spiffe_ids_allowed if {
	spec := {"sourceSelector": [{"spiffeIDs": ["spiffe://spire.example/ns/default/sa/client"]}]}
	count(deny) == 0 with input as policy(spec, {})
}

test_empty_spiffe_ids_denied if {
	count(deny) == 1 with input as policy({"sourceSelector": [{"spiffeIDs": []}]}, {})
}

test_spiffe_ids_do_not_close_an_open_matcher if {
	spec := {"sourceSelector": [{"spiffeIDs": ["spiffe://spire.example/x"], "kubeIdentityMatcher": {}}]}
	count(deny) == 1 with input as policy(spec, {})
}

test_delete_allowed if {
	count(deny) == 0 with input as object.union(policy({}, {}), {"operation": "DELETE"})
}

test_no_spec_denied if {
	count(deny) == 1 with input as json.remove(policy({}, {}), ["object/spec"])
}

test_odd_types_denied if {
	count(deny) == 1 with input as policy({"sourceSelector": "x", "destinationSelector": [7, null]}, {})
}

test_other_kinds_ignored if {
	count(deny) == 0 with input as object.union(policy({}, {}), {"kind": "TrafficPolicy"})
}
