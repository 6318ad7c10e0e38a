// Package policy translates the user's TrafficPolicies and AccessPolicies
// into Istio configuration: AccessPolicy → AuthorizationPolicy
// (TranslateAccess) and TrafficPolicy → VirtualService + DestinationRule
// (TranslateTraffic).
//
// Both translators are pure functions of a translation.Input: they read no
// cluster, add objects to a translation.Output and give every policy they
// see a status in a translation.Report. Output is deterministic: objects are
// named after their Destination, and every list is built in a fixed order,
// so the same input in any order yields byte-identical output. A policy the
// translators cannot honour is reported Invalid with a message that says
// why; nothing is silently dropped, and partial input never panics.
package policy
