// Package manifest reads the objects an offline view of Relaymesh is built
// from — the YAML and JSON files of a GitOps repository, standard input,
// what `relaymesh policy export` writes and the Lists `kubectl get -o yaml`
// writes — and checks every Relaymesh object the way the API server would
// before storing it, so that an offline audit sees the world applying those
// files would make.
//
// Reading: a path is a file (read whatever its name), a directory (every
// .yaml, .yml and .json file below it, recursively, in lexical order;
// directories whose name starts with a dot, such as .git, are skipped) or
// "-" (standard input). A file is a stream of YAML documents or JSON
// objects; a document of kind List (or any kind ending in List with items)
// stands for its items. Reading is bounded in bytes, files and documents
// (Config); beyond a bound it stops with ErrTooLarge.
//
// Checking, per document:
//   - A Relaymesh object (a kind of api/crds, at the apiVersion the CRD
//     serves) is prepared and validated as on create, with the API server's
//     own libraries: status dropped, unknown fields refused (kubectl's
//     strict field validation), defaults applied, then metadata, the
//     OpenAPI schema and the CEL rules. Each error is a Problem with the
//     field path and the schema's message, and the object is left out (the
//     API server would refuse it).
//   - A Relaymesh kind under another apiVersion, an unknown kind of a
//     Relaymesh group, a document with apiVersion but no kind (or the
//     reverse), malformed YAML and an object defined twice are Problems.
//   - A Namespace gives its labels (admission rules may read them); a
//     ConfigMap labelled relaymesh.io/admission-policy in the server's
//     namespace is an admission rule set, as the server loads it.
//   - Anything else (Deployments, Services, Helm values, …) is skipped
//     with a Note.
//
// Admission itself is not run here: the caller judges the Input as the
// server does (translation/all.InForce), with the rule sets read.
package manifest
