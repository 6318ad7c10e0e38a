// Package policy translates TrafficPolicies and AccessPolicies into Istio
// VirtualServices, DestinationRules and AuthorizationPolicies, admits user
// policies through OPA (Rego) before translation, and audits who can reach
// what.
//
// Status: not yet implemented; the translation and admission issues build it.
package policy
