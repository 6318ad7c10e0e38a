// Package discovery runs in the agent: it watches its workload cluster with
// client-go shared informers (no polling) and builds discovery snapshots
// (relaypb.Snapshot) of the Istio meshes, the sidecar-injected and
// ambient-enrolled workloads, the waypoints, and the Services that select
// those workloads.
//
// The package has two halves. Build is a pure function from cluster objects
// (Inputs) to a snapshot; it makes no client calls, so every rule below is a
// table test. Discoverer feeds Build from informer caches and signals
// Changes; callers compare Hash values and send nothing when the content is
// unchanged.
//
// # Determinism
//
// Build sorts every list (meshes, gateways, workloads, destinations by
// namespace then name; workloads of equal name by kind; endpoints by IP) and
// never depends on map or input order, so the same objects in any order give
// the same snapshot and the same Hash. Hash is snapshothash.Of (package
// relay/snapshothash, the wire's one definition): the hex SHA-256 of the
// deterministic protobuf encoding of the snapshot with its hash field
// cleared. Every Mesh, Workload and
// Destination carries the configured cluster name, as does the Snapshot.
//
// # Meshes
//
//   - A Deployment labelled app=istiod or istio=pilot is an istiod; each is
//     one Mesh named and namespaced like the Deployment.
//   - Revision: the label istio.io/rev of the Deployment (else of its pod
//     template); "" and "default" both mean the default revision, reported
//     as "".
//   - Version: the Deployment's label operator.istio.io/version, else the
//     image tag of the first container ("" when the image has no tag).
//   - Mesh config: the ConfigMap "istio" (default revision) or
//     "istio-<rev>" in the istiod's namespace, key "mesh", parsed as YAML.
//     TrustDomain is its trustDomain, default "cluster.local" (also when
//     the ConfigMap is missing or does not parse). SmartDnsProxying is true
//     when defaultConfig.proxyMetadata.ISTIO_META_DNS_CAPTURE is "true"
//     (a YAML boolean true counts too).
//   - IstiodServiceAccount is the pod template's serviceAccountName,
//     default "default"; PodLabels are the pod template labels.
//
// # Gateways
//
//   - A Service labelled istio=ingressgateway is an "Ingress" gateway,
//     istio=eastwestgateway an "EastWest" one, in any namespace.
//   - It belongs to a mesh in its own namespace when there is one (of
//     several there: the one whose revision equals the Service's
//     istio.io/rev label, else the default-revision one, else the first by
//     name). Otherwise it belongs to the only mesh of the cluster, else to
//     the mesh of the Service's istio.io/rev revision, else to the
//     default-revision mesh (the first by namespace/name); with none of
//     these it is not reported.
//   - ExternalAddress: the first status.loadBalancer.ingress entry (its ip,
//     else its hostname), else spec.externalIPs[0], else spec.clusterIP
//     unless it is "None".
//   - TlsPort: the port named "tls", else 15443 when the Service has that
//     port, else 0. WorkloadLabels are the Service selector.
//
// # Workloads
//
// Deployments, StatefulSets and DaemonSets are workloads when their pods get
// a sidecar, except the istiod Deployments and anything labelled (on the
// object or its pod template) istio=ingressgateway or istio=eastwestgateway.
// Injection is decided on the pod template and its namespace, in order:
//
//  1. The pod template label sidecar.istio.io/inject, else the annotation of
//     that name: "false" means not injected; "true" means injected, by the
//     revision of the template's istio.io/rev label, else the default one
//     when the namespace has istio-injection=enabled, else the namespace's
//     istio.io/rev, else the default revision. Other values are ignored.
//  2. A namespace label istio-injection=enabled means injected by the
//     default revision; any other value of it (such as "disabled") means
//     not injected, as in Istio's webhook selectors.
//  3. A namespace label istio.io/rev=<rev>, else a pod template label
//     istio.io/rev=<rev>, means injected by that revision.
//  4. Otherwise: not injected.
//
// An injected workload is reported only when the cluster has a mesh of its
// revision (of several, the first by namespace/name); MeshName and
// MeshNamespace name that istiod. PodLabels are the pod template labels;
// ServiceAccount is the template's serviceAccountName, default "default".
// A workload that is not injected is an ambient one (see Ambient) when its
// pods are enrolled; otherwise it is not reported.
//
// # Ambient
//
// (docs/design/2026-12-02-ambient-translation.md says what translation
// makes of it.)
//
//   - A mesh is ambient when a container of its istiod Deployment has the
//     env var PILOT_ENABLE_AMBIENT set to a true value (strconv.ParseBool);
//     Ztunnel when, besides, a DaemonSet labelled (on the object or its pod
//     template) app=ztunnel runs in the istiod's namespace.
//   - Waypoints: Gateways (gateway.networking.k8s.io/v1) of class
//     istio-waypoint, attached to the ambient mesh of their istio.io/rev
//     (else the default revision); none for a mesh that is not ambient.
//     TrafficType is the label istio.io/waypoint-for, default "service";
//     a value istiod does not know (not service, workload, all, none) is
//     not a waypoint. ServiceAccount is that of the first Deployment (by
//     name) in the Gateway's namespace whose pod template has
//     gateway.networking.k8s.io/gateway-name=<gateway>, else empty. Ready
//     when status.addresses is not empty.
//   - Network and east-west gateways (ambient meshes only): Network is the
//     topology.istio.io/network label of istiod's namespace (what ambient
//     istiod reads), empty when absent or not a label value.
//     EastWestGateways are the Gateways of class istio-east-west of the
//     mesh's revision with a topology.istio.io/network label and an HBONE
//     listener (HbonePort: the first such listener's port); Addresses are
//     their status.addresses of type IPAddress or Hostname (at most 16);
//     ServiceAccount is the gateway.istio.io/service-account annotation,
//     else the Gateway's name. A Gateway without a network or an HBONE
//     listener is not one istiod uses and is not reported. MultiNetwork:
//     istiod's container env has AMBIENT_ENABLE_MULTI_NETWORK true.
//     GlobalServiceScope: the mesh config's serviceScopeConfigs hold a
//     GLOBAL entry with no namespaceSelector whose servicesSelector is
//     empty or exactly istio.io/global=true (matchLabels, or In ["true"]).
//     Both only for ambient meshes.
//   - Enrolment, after istio-cni's default selectors: a workload that is
//     not injected is ambient when its pod template has
//     istio.io/dataplane-mode=ambient, or its namespace has it and the pod
//     template does not say "none"; a sidecar always wins. Its mesh is the
//     one of the template's istio.io/rev, else the namespace's, else the
//     default revision, and must be ambient; otherwise it is not reported.
//     Pod templates of ztunnel (app=ztunnel) and of Gateways (with
//     gateway.networking.k8s.io/gateway-name) are never workloads.
//     DataPlaneMode is "ambient"; sidecar workloads leave it empty.
//   - Waypoint bindings (istio.io/use-waypoint): for an ambient workload, on
//     its pod template, else its namespace; for a Destination, on the
//     Service, else its namespace. The namespace of the waypoint is
//     istio.io/use-waypoint-namespace on the same object, else the object's
//     own. "none", or a name that is not a DNS subdomain (or a namespace
//     that is not a DNS label), binds to nothing.
//   - A Destination's DataPlaneMode is "ambient" when every workload it
//     selects is ambient, "mixed" when some are, else empty (sidecar). Its
//     ready pods count too: while one still runs with a sidecar (the
//     injector's sidecar.istio.io/status annotation, or an istio-proxy
//     container) behind ambient workloads, or one captured by istio-cni runs
//     behind sidecar workloads, it is "mixed" (a namespace relabelled for
//     ambient before its pods restart, or a rollback).
//   - An endpoint is Ambient when its pod has the annotation
//     ambient.istio.io/redirection=enabled (written by istio-cni).
//
// # Destinations
//
//   - A Service with a non-empty selector that is not a gateway Service is a
//     Destination when its selector matches the pod template labels of at
//     least one reported workload in its namespace. Its mesh is the mesh of
//     the first matching workload (by name, then kind).
//   - Ports keep the Service's order: port, name, protocol (default "TCP"),
//     appProtocol, else the protocol Istio infers from the port name
//     ("grpc-web" prefix, else the part before the first '-' when it is one
//     of tcp, udp, grpc, http, http_proxy, http2, https, tls, mongo, redis,
//     mysql; compared case-insensitively and reported in lower case), and
//     the target port as a string (the port number when unset).
//   - Subsets: for every label key that all matching workloads carry, that
//     the selector does not name, and whose values differ among them, the
//     sorted distinct values (e.g. version: [v1, v2]).
//   - Labels are the Service labels; ServiceType its type (default
//     "ClusterIP"); ExternalAddresses every status.loadBalancer.ingress ip
//     (else hostname) then every spec.externalIPs entry, without
//     duplicates.
//   - Endpoints: Pods in the namespace whose labels match the selector, that
//     have status.podIP, are not being deleted, are not Succeeded or
//     Failed, and are ready: condition Ready=True, or phase Running when the
//     pod reports no conditions at all. Each gives its IP and labels; sorted
//     by IP as a string (then pod name).
//
// # Bounds
//
// Build is linear in its input up to sorting: objects are grouped by
// namespace, and selectors are matched through a per-namespace index of
// label pairs (the rarest pair of a selector names the candidates), so no
// loop runs over every pod or workload of the cluster for every Service.
// Only the ConfigMaps an istiod refers to are parsed. Nil objects in Inputs
// are skipped. Output maps are copies; Build never mutates its input.
// Protobuf strings must be UTF-8, so Build repairs strings that are not
// (U+FFFD) and drops map entries whose key is not; objects read from an API
// server are always valid already.
//
// # Discoverer
//
// Discoverer runs shared informers on Namespaces, Deployments, StatefulSets,
// DaemonSets, Services, ConfigMaps and Pods, and, with Config.Dynamic and
// when the apiserver serves them as Run starts, on Gateway API Gateways. Its
// caches keep only what Build reads: managed fields are dropped from every
// object, Pods keep their metadata (of annotations, only
// ambient.istio.io/redirection) and the status fields readiness needs, and
// ConfigMaps other than "istio" and "istio-*" keep no data. Events on those
// other ConfigMaps, and resync updates that change no resource version, do
// not count as changes. Any other event arms a timer of Config.Debounce
// (default 100ms); when it fires, Changes receives one value (the channel
// holds at most one). An event while the timer runs is folded into it and
// arms the timer again once the value is sent, so a change is never
// missed and a burst of events is at most one value per Debounce.
package discovery
