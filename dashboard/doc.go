// Package dashboard is Relaymesh's read-only web UI, served by the
// management server on its own port (`relaymesh server --dashboard-listen`):
// the fleet of clusters and agents, every certificate Relaymesh issued or
// manages, each VirtualMesh's shared trust and root rotation, the status of
// every policy, the effective access (the `relaymesh policy audit` matrix,
// a graph and what-if), and the audit log with its chain verified.
//
// # Security model
//
// Nothing is served without a caller the management cluster's apiserver
// vouches for, and every view is authorized for that caller:
//
//   - Authentication is the Kubernetes way: a bearer token the apiserver
//     accepts (from `kubectl create token`, or an OIDC token), checked with
//     a TokenReview. Browsers paste it once into the login form; the server
//     checks it and keeps it in an HttpOnly, SameSite=Strict cookie scoped
//     to the dashboard's path. API clients send it as an Authorization
//     header instead.
//   - Authorization is a SubjectAccessReview per request for each
//     Relaymesh resource the view shows (Views lists them; ViewerRules is
//     the ClusterRole that grants them all). A caller refused any of them
//     gets 401 or 403 and no data.
//   - CSRF: every view is a GET that changes nothing. The two POSTs (login,
//     logout) and the what-if (a POST because a policy does not fit a URL,
//     and it changes nothing either) need a same-origin request
//     (net/http's CrossOriginProtection: Sec-Fetch-Site, else Origin against
//     Host) and, once signed in, a form token derived from the session's
//     token. The cookie is SameSite=Strict, so no other site's page sends it.
//   - XSS: every string from a cluster is untrusted. Pages are html/template
//     (contextual escaping, no template.HTML of cluster data); the only
//     script is the embedded assets/app.js, which writes with textContent;
//     the Content-Security-Policy allows scripts, styles and connections to
//     this origin only, no inline script or style, no framing, and Trusted
//     Types, so an HTML sink in script would fail.
//   - Every asset is embedded in the binary; nothing is loaded from
//     elsewhere.
//
// The dashboard reads the management cluster through its own informers
// (Source) and the server's in-memory state through small interfaces
// (Agents, Relay); it never reads a Secret.
package dashboard
