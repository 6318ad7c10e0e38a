// Package helm tests the Helm charts of charts/ the way a cluster admin
// uses them, with the helm binary `make tools` builds (Helm v3), against
// real kube-apiservers from test/localcluster:
//
//   - helm lint --strict, the values schemas refusing bad values, and the
//     rendered objects (default and production values) server-side applied
//     to a real API server; Pods from both Deployments admitted by a
//     namespace enforcing Pod Security "restricted";
//   - RBAC proven by the real processes: both charts installed, then
//     `relaymesh server` and `relaymesh agent` run as processes
//     authenticated as the charts' ServiceAccounts (TokenRequest tokens)
//     through the main job; the API servers' audit logs show every rule and
//     verb the charts grant in use, and removing any one rule breaks the job;
//   - helm upgrade from the previous chart version, and uninstall plus
//     reinstall, keep every relay and CA Secret byte for byte, and the
//     agents reconnect without a new bootstrap token.
package helm
