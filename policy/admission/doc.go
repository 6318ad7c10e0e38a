// Package admission decides whether a user object (VirtualMesh,
// TrafficPolicy, AccessPolicy, VirtualDestination) may exist, by evaluating
// Rego deny rules with OPA. The same Engine.Decide serves the Kubernetes
// admission webhook and the in-process check before translation, so both
// give the same answer for the same object.
//
// # Rules
//
// Rules live in rule sets. The default rule set is embedded in the binary
// (rules/*.rego); user rule sets come from ConfigMaps labelled
// relaymesh.io/admission-policy in the server's namespace (Loader): every
// data key ending in ".rego" of one ConfigMap is one file of one rule set.
// Every file is Rego v1 and its package MUST be below
// relaymesh.admission (for example relaymesh.admission.team_rules). A
// package MUST NOT be used by two rule sets, nor be a prefix of another rule
// set's package, so one rule set cannot add to, override or shadow another,
// the default one included. A deny rule MUST be a multi-value rule:
//
//	deny contains msg if { ... }
//
// where msg is a string (anything else is reported as its JSON text). The
// decision is the union of the deny sets of every package of every accepted
// rule set: the object is allowed if and only if that union is empty. Each
// Denial names the package that produced it (Denial.Rule, e.g.
// "relaymesh.admission.access_allow_all").
//
// # Input document
//
// Rules see this input, the contract user rules are written against:
//
//	{
//	  "operation":       "CREATE" | "UPDATE" | "DELETE",
//	  "kind":            "AccessPolicy",        // the object's Kind
//	  "namespace":       "team-a",              // the object's namespace
//	  "name":            "reviews-readers",     // the object's name
//	  "object":          {...},                 // the object as stored (apiVersion, kind, metadata, spec);
//	                                            // absent for DELETE
//	  "oldObject":       {...},                 // the previous object for UPDATE, the deleted one
//	                                            // for DELETE; absent for CREATE
//	  "user":            {"username": "alice", "groups": ["team-a"]},
//	  "namespaceLabels": {"relaymesh.io/environment": "production"}
//	                                            // labels of the object's namespace, {} if none
//	}
//
// Objects are the JSON form of the Kubernetes object after defaulting (the
// form the API server stores); numbers are JSON numbers. The caller supplies
// the user and the namespace labels: the webhook from the AdmissionReview,
// the in-process check from the object's last writer (or an empty user) and
// its namespace.
//
// # Default rules
//
//   - relaymesh.admission.access_allow_all: an AccessPolicy whose sources and
//     destinations both select everything (missing or empty selector list, or
//     a selector that restricts nothing) needs the annotation
//     relaymesh.io/allow-all: "true".
//   - relaymesh.admission.production_fault_injection: a TrafficPolicy with
//     spec.policy.faultInjection is refused when the policy's own namespace is
//     labelled relaymesh.io/environment: production.
//   - relaymesh.admission.root_key_strength: a VirtualMesh whose
//     spec.mtls.shared.rootCA.generated.keyAlgorithm is weaker than ECDSA P-256
//     or RSA 3072 (anything but ECDSAP256, ECDSAP384, RSA3072, RSA4096;
//     omitted means the API default, ECDSAP256) is refused.
//
// # Loading: self-test, limits and sandbox
//
// A rule set is accepted only if it parses, compiles on its own, defines at
// least one test_ rule, and all of its test_ rules pass (OPA's tester, each
// test bounded by Config.TestTimeout). A refused rule set does not replace
// the last accepted version of the same rule set, which stays in force;
// the refusal (file and failing test named) shows in Engine.Status and the
// metrics. A rule set over Config.MaxRuleSetBytes (256 KiB) and rule sets
// beyond Config.MaxRuleSets (100 user rule sets; those already in force keep
// their place) are refused. Rules are compiled with a restricted set of
// built-in functions: no network (http.send, net.lookup_ip_addr, JSON schema
// functions that may fetch references), no opa.runtime, and nothing
// non-deterministic (time.now_ns, rand.intn, uuid.rfc4122, ...), so a
// decision depends on its input and the rules alone and the webhook and the
// in-process check agree. A rule set calling such a function fails to
// compile and is refused.
//
// # Failing closed
//
// Decide never allows an object it could not judge. Each decision runs
// under Config.Timeout (500 ms by default); built-in errors are errors
// (strict mode). If the input cannot be converted (deeper than MaxDepth,
// non-JSON values), the evaluation fails or times out, or the decision
// cannot be written to the audit log, Decide returns a Decision with
// Allowed false and a Denial saying that the admission check failed, and an
// error wrapping ErrCheckFailed. Every decision is recorded as an
// audit.AdmissionDecision event before Decide returns.
//
// Decide evaluates only the packages whose deny set may be non-empty for
// the input: those OPA's rule index and the rules' leading guards (equalities
// between the input and constants) do not rule out (index.go). A package
// left out would have produced no denial and no error, so every decision,
// error included, is that of evaluating every package.
//
// Whoever may write labelled ConfigMaps in the server's namespace controls
// admission: a rule set can deny everything (for example with a rule that
// errors on every input). Evaluation time is bounded, memory is not.
package admission
