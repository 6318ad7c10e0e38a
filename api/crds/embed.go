// Package crds embeds Relaymesh's generated CustomResourceDefinition
// manifests, so installers and tests apply exactly what `make gen` produced.
package crds

import "embed"

// FS holds one YAML file per CRD.
//
//go:embed *.yaml
var FS embed.FS
