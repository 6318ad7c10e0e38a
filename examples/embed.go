// Package examples holds the sample manifests the demo applies; they are
// plain YAML a person can also apply by hand.
package examples

import "embed"

// Demo holds examples/demo/*.yaml.
//
//go:embed demo/*.yaml
var Demo embed.FS
