// Package dashboard is Relaymesh's read-only web UI, served over TLS by the
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
//   - Transport: TLS (a certificate from the relay CA, or provided files,
//     reloaded; see tls.go). Plain HTTP is a WEAKER opt-in the server
//     allows on a loopback address only.
//   - Authentication is the Kubernetes way: a bearer token the apiserver
//     accepts for the dashboard's audience (`kubectl create token NAME
//     --audience relaymesh-dashboard`, or an OIDC token for it), checked
//     with a TokenReview whose answer must name that audience. Browsers
//     paste it once into the login form; the server keeps it in memory and
//     gives the browser only a random session id (session.go): HttpOnly,
//     SameSite=Strict, and over TLS Secure with the __Host- prefix. The
//     token never leaves the server again; sessions end at sign-out, when
//     idle, at a maximum lifetime, at the token's expiry or revocation, and
//     live in one replica only. API clients send the token as an
//     Authorization header instead.
//   - Authorization is a SubjectAccessReview per request for each
//     Relaymesh resource the view shows (Views lists them; ViewerRules is
//     the ClusterRole that grants them all). A caller refused any of them
//     gets 401 or 403 and no data. A Section that needs more (the Trust
//     page's federation peers) is checked the same way; refused, the view
//     is served with the section naming what it needs, without its data.
//   - CSRF: every view is a GET that changes nothing. The two POSTs (login,
//     logout) and the what-if (a POST because a policy does not fit a URL,
//     and it changes nothing either) need a same-origin request
//     (net/http's CrossOriginProtection: Sec-Fetch-Site, else Origin against
//     Host) and, once signed in, the session's own random form token. The
//     cookie is SameSite=Strict, so no other site's page sends it.
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
