// Package federation translates VirtualMeshes into Istio configuration for
// every member mesh's cluster. Translate is a pure function from a
// translation.Input to additions to a translation.Output and a status in the
// translation.Report; it makes no client calls and its output depends only on
// the input set (never on list order).
//
// For a valid VirtualMesh it produces:
//
//   - Federation (spec.federation.selectors; omitted or empty: nothing
//     federates, a selector with no fields: every Destination to every other
//     member). For a Destination D of mesh A federated to mesh B:
//     in B's cluster, in B's root namespace (the mesh's installation
//     namespace), a ServiceEntry and a DestinationRule named
//     `<svc>-<ns>-<clusterA>` (sanitized; longer than 63 characters:
//     truncated with a hash suffix). The ServiceEntry's host is
//     `<svc>.<ns>.svc.<clusterA>.<suffix>` (suffix default "global"),
//     location MESH_INTERNAL, one synthetic address from 240.0.0.0/8 (outside
//     Istio's own auto-allocation block 240.240.0.0/16) so TCP ports get a
//     listener of their own, and endpoints at A's east-west gateways' external
//     addresses with every port mapped to the gateway's TLS port (resolution
//     STATIC when every address is an IP, else DNS). The DestinationRule sets
//     ISTIO_MUTUAL and, per port, the SNI `outbound_.<port>_._.<host>`, which
//     is the Envoy cluster name an AUTO_PASSTHROUGH gateway routes on (a plain
//     hostname SNI would match none of its filter chains).
//     In A's cluster: a Gateway per usable east-west gateway (in A's root
//     namespace, selecting the gateway's workload labels, server "tls" on
//     the TLS port, AUTO_PASSTHROUGH, hosts `*.<suffix>`), and a ServiceEntry
//     in D's namespace for the federated host that selects D's pods
//     (workloadSelector, resolution STATIC), exported only to the gateways'
//     namespaces, so the gateway knows the Envoy cluster the SNI names.
//
//   - flatNetwork: no gateway is involved; clients in B connect to D's pods
//     directly, over Istio mTLS with the identities of A's mesh. In B's
//     cluster, in B's root namespace, under the same names and host: a
//     ServiceEntry (MESH_INTERNAL, resolution STATIC, the synthetic address)
//     whose endpoints are D's ready endpoints as discovery reports them
//     (pod IP and pod labels, so subsets select them; sorted, duplicates
//     dropped, an address that is not an IP left out and reported), whose
//     ports carry the pods' port as targetPort, and whose subjectAltNames are
//     the SPIFFE IDs of D's pods: spiffe://<trust domain of the workload's
//     mesh>/ns/<ns>/sa/<service account> for every discovered Workload in
//     D's cluster and namespace whose pod labels D's selector matches
//     ("default" when it names no account). Istio would otherwise derive the
//     names from endpoint service accounts in B's own trust domain, which
//     A's certificates do not carry. A DestinationRule sets ISTIO_MUTUAL
//     with no SNI (there is no gateway to route on it). A port whose target
//     is a named container port is left out and reported (Destinations do
//     not carry the pods' numbers for names); a Destination with no such
//     identity is not federated and reported, since clients could not verify
//     its pods (fail closed). A Destination with no ready endpoint keeps its
//     ServiceEntry, with no endpoints. No Gateway and no local ServiceEntry
//     are made. The servers need mTLS STRICT (mtls.strictMTLS) for
//     proxyless gRPC, which serves PERMISSIVE as plaintext.
//
//   - mtls.strictMTLS: a PeerAuthentication "default" (STRICT) in each
//     member's root namespace.
//
//   - globalAccessPolicy Enabled: an AuthorizationPolicy
//     "relaymesh-global-deny" in each member's root namespace that allows
//     nothing (ALLOW with one rule no request matches: principals ["*"] and
//     notPrincipals ["*"]; an empty spec would do for Envoy, but istiod
//     gives proxyless gRPC servers no RBAC filter for a policy without
//     rules, so they would allow everything) and,
//     for each east-west gateway with workload labels, an ALLOW policy with
//     one empty rule selecting it, so cross-cluster traffic can enter. An
//     ambient member also gets "relaymesh-global-deny-waypoints", the same
//     rule with targetRefs GatewayClass istio-waypoint: waypoints read only
//     targetRefs policies, so without it a waypoint would pass everything
//     and the deny would hold only at the destination's ztunnel.
//     Disabled and MeshDefault produce nothing.
//
//   - Ambient federation (docs/design/2026-12-04-ambient-federation.md):
//     an ambient Destination D (mode ambient or mixed) of an ambient mesh B
//     federated to an ambient mesh A on another network, with one trust
//     domain and B's east-west gateway (class istio-east-west, HBONE,
//     programmed) known: in A's cluster a Gateway
//     `relaymesh-<clusterB>-<gateway>` in A's root namespace (class
//     istio-remote, label topology.istio.io/network, annotation
//     gateway.istio.io/service-account, B's addresses, an HBONE listener on
//     B's port), a Service `<svc>` in D's namespace (label
//     istio.io/global=true, D's ports, selector
//     relaymesh.io/global-service=<svc>) and a WorkloadEntry per ready pod
//     (network B's, the pod's IP and the account of the Workload that runs
//     it). A pair that cannot — no network, one network, no programmed
//     gateway, different trust domains — is an error on B's target, once;
//     a Service A holds itself, a system or root namespace, and a pod with
//     no known account are errors naming the Destination. A member that
//     runs only ambient workloads gets no sidecar-era federated hosts.
//
//   - A member whose cluster is not registered takes no part: a warning
//     and an Invalid target, while the others federate (an Invalid
//     VirtualMesh would keep its last valid outputs, a deregistered
//     cluster's exports with them). With no member in a registered
//     cluster the VirtualMesh is Invalid: it is in force nowhere.
//
// Port protocols use Istio's names (HTTP, HTTP2, GRPC, HTTPS, TLS, TCP),
// taken from the port's appProtocol, else from its name's prefix (Istio's
// `<protocol>[-<suffix>]` convention); anything else is TCP, which carries
// every kind of traffic but without L7 features. UDP and SCTP ports are not
// federated (Istio does not proxy them).
//
// Validation: every referenced Mesh must exist and be an Istio mesh with an
// installation cluster and namespace; a Mesh may belong to one VirtualMesh
// only: the later VirtualMesh (by creation time, then namespace/name) is
// Invalid and names the earlier one; federation selectors may only name
// members; eastWestGatewaySelectors is not supported yet and makes the
// VirtualMesh Invalid rather than being ignored. An Invalid VirtualMesh
// produces nothing. Problems with one Destination (no usable east-west
// gateway, no ports, no pod selector) do not stop the others: the VirtualMesh
// stays Accepted and the exporting mesh's target status lists the errors.
package federation
