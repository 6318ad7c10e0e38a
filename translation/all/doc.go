// Package all is the whole translation, above the translators: Translate
// runs namespace tenancy (ScopePolicies) and then every translator
// (federation, policy) over one input, as the server does; InForce and
// TranslateInForce first leave out what admission refuses; and the
// Describe functions explain, object by object, what applies and what it
// produces, reading federation from the federation plan itself.
//
// It is pure: no client, no informer. The server's informer-driven
// translation/controller and every operator view (`relaymesh describe`,
// `relaymesh policy audit`, the dashboard) use it, so a translator need not
// import the controller to see the whole picture, and a view cannot drift
// from what the server enforces.
package all
