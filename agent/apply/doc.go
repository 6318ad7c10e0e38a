// Package apply makes a workload cluster match the output set the management
// server sends its agent, without ever harming objects the agent does not
// own. It is the agent side of the Pull stream (see relay/proto, OutputSet
// and PullAck).
//
// The management server is not trusted with the cluster: it can only ask for
// objects of the kinds in the agent's allowlist (Istio networking and
// security kinds by default), in a namespace, with no ownership or lifecycle
// metadata of its own. Every object the agent writes carries the label
// outputs.OwnerLabel (relaymesh.io/owner) with the agent's owner value;
// that label is the ownership claim.
//
// Contract of Applier.Apply:
//   - It MUST validate every manifest before the first write, and MUST refuse
//     a whole set that is larger than the configured limit without changing
//     anything.
//   - It MUST NOT modify an existing object that lacks the owner label (or
//     carries another owner's value); it reports "conflict" instead. New
//     objects are created with a plain create, so one that appears between
//     the agent's read and its write is never adopted.
//   - It MUST NOT delete an object unless it carries the owner label when it
//     is deleted (deletes carry UID and resourceVersion preconditions), and
//     MUST NOT delete an object the set names, even one that failed to
//     apply. A kind it cannot list is not pruned at all, and a manifest whose
//     identity cannot be read suspends pruning for the whole set.
//   - An object already exactly as the set says (the agent's apply entry
//     owns exactly its fields, with equal values) costs no write; when that
//     cannot be told for sure, the object is server-side applied and the
//     API server decides.
//   - It reports one result per object of the set, one per pruned object and
//     one per allowed kind it could not list, sorted by apiVersion, kind,
//     namespace and name.
//
// An object created by someone else but labelled with the agent's owner
// value is treated as the agent's own: it is updated when the set names it
// and pruned when the set does not. Objects labelled with a different owner
// value are never touched.
package apply
