// Package accessaudit answers "who can reach what, and why" for a
// translation.Input: the effective access matrix (every source identity ×
// destination port that is allowed, with the AccessPolicies that allow it),
// findings about the policies (allow-everyone, shadowed, matching nothing,
// not in force, destinations reachable from outside their VirtualMesh,
// TrafficPolicy conflicts, …), and the difference a proposed change would
// make (what-if).
//
// The matrix follows what translation produces in Istio, not what the
// policies say on their own. It is computed from the same input the server
// translates, with the same selectors (translation.MatchDestination,
// policy.MatchAccessSource) and the same decision of what is in force
// (all.TranslateInForce: the server's admission engine and rules,
// namespace tenancy, for live views the Invalid statuses the server wrote,
// and anything else translation refuses). An object that is not in force
// allows nothing and restricts nothing, and is a finding (refused-by-admission
// or not-in-force). The rules:
//
//   - A source identity is a (cluster, namespace, service account, mesh) of
//     the discovered Workloads; Istio knows it by its principal
//     `<trust domain>/ns/<ns>/sa/<sa>` (trust domain of its Mesh). An
//     AuthorizationPolicy names principals, so a policy allows every identity
//     with a principal it names, including identities it did not select that
//     share the principal (reported as a shared-principal finding). An
//     identity without a known trust domain is never allowed by a policy.
//   - A Destination selected by no AccessPolicy in force is open: every
//     identity that can route to it may call it on every port, unless its
//     mesh belongs to a valid VirtualMesh with globalAccessPolicy Enabled
//     (deny by default: nothing is allowed but what AccessPolicies allow).
//   - A Destination selected by AccessPolicies in force is reachable only by
//     their sources, even when those sources match nothing (translation then
//     writes an AuthorizationPolicy with no rules, which allows nothing).
//     allowedPorts are compared with the port the server's sidecar sees (the
//     Service port's numeric targetPort, else the Service port).
//     allowedPaths and allowedMethods are conditions on the pair; Istio
//     ignores an ALLOW rule with HTTP-only fields on a port it treats as
//     plain TCP, so such a policy allows nothing on TCP ports (ports whose
//     protocol is unknown are sniffed by Istio and keep the conditions).
//     UDP and SCTP ports are left out: Istio does not proxy them.
//   - At a Destination whose workloads run in ambient mode, paths and
//     methods are checked by the waypoint that serves its Service; where no
//     usable waypoint serves it, translation writes nothing of such a
//     policy there (its target is Failed, "needs a waypoint"), so the
//     policy allows no one there and is a needs-waypoint finding. At a
//     mixed Destination (a migration) the pods that still have a sidecar
//     admit its sources, so the pair stays, with the finding.
//   - A route must exist: a source reaches a Destination of its own cluster
//     directly; one in another cluster only where translation publishes the
//     Destination's federated host (a VirtualMesh's federation selectors) or
//     a VirtualDestination it backs. A policy that allows a source without a
//     route is not in the matrix; it is an unreachable-grant finding.
//
// Audit is a pure function of its input; its output is sorted and does not
// depend on the order of the input's lists.
package accessaudit
