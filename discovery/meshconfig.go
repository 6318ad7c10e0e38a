package discovery

import "sigs.k8s.io/yaml"

const (
	// meshConfigKey is the key of the mesh config in the istio ConfigMap.
	meshConfigKey = "mesh"
	// defaultTrustDomain is Istio's trust domain when the mesh config
	// names none.
	defaultTrustDomain = "cluster.local"
	// dnsCaptureKey turns on Istio's DNS proxying ("smart DNS").
	dnsCaptureKey = "ISTIO_META_DNS_CAPTURE"
)

// meshConfig is the part of Istio's MeshConfig discovery reports.
type meshConfig struct {
	TrustDomain string
	DNSCapture  bool
	// GlobalScope: serviceScopeConfigs make a Service labelled
	// istio.io/global=true global (the ambient profile's entry, or one
	// broader), which ambient federation relies on.
	GlobalScope bool
}

// parseMeshConfig reads the trust domain and DNS capture setting from a
// YAML mesh config. It never fails: a document that does not parse, or a
// field of the wrong type, leaves the Istio default for that field.
func parseMeshConfig(doc string) meshConfig {
	mc := meshConfig{TrustDomain: defaultTrustDomain}
	// Decode loosely, so one field of an unexpected type does not hide the
	// others.
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(doc), &raw); err != nil {
		return mc
	}
	if td, ok := raw["trustDomain"].(string); ok && td != "" {
		mc.TrustDomain = td
	}
	defaultConfig, _ := raw["defaultConfig"].(map[string]any)
	proxyMetadata, _ := defaultConfig["proxyMetadata"].(map[string]any)
	switch v := proxyMetadata[dnsCaptureKey].(type) {
	case string:
		mc.DNSCapture = v == "true"
	case bool:
		mc.DNSCapture = v
	}
	scopes, _ := raw["serviceScopeConfigs"].([]any)
	for _, sc := range scopes {
		if globalLabelScope(sc) {
			mc.GlobalScope = true
		}
	}
	return mc
}

// labelGlobal is the label the ambient profile's serviceScopeConfigs make
// global.
const labelGlobal = "istio.io/global"

// globalLabelScope says whether one serviceScopeConfigs entry makes every
// Service labelled istio.io/global=true global, in any namespace: scope
// GLOBAL, no namespaceSelector, and a servicesSelector that is empty or
// asks exactly for that label (matchLabels, or an In expression with
// "true"). Broader or narrower selectors istiod may also honour are not
// judged: Relaymesh then says the scope is not known.
func globalLabelScope(v any) bool {
	sc, _ := v.(map[string]any)
	if scope, _ := sc["scope"].(string); scope != "GLOBAL" {
		return false
	}
	if ns, ok := sc["namespaceSelector"].(map[string]any); ok && len(ns) > 0 {
		return false
	}
	sel, _ := sc["servicesSelector"].(map[string]any)
	if len(sel) == 0 {
		return true
	}
	labels, _ := sel["matchLabels"].(map[string]any)
	exprs, _ := sel["matchExpressions"].([]any)
	switch {
	case len(labels) == 1 && len(exprs) == 0:
		return labels[labelGlobal] == "true"
	case len(labels) == 0 && len(exprs) == 1:
		e, _ := exprs[0].(map[string]any)
		values, _ := e["values"].([]any)
		return e["key"] == labelGlobal && e["operator"] == "In" && len(values) == 1 && values[0] == "true"
	}
	return false
}

// MeshTrustDomain is the trust domain a YAML mesh config (the `mesh` key of
// istiod's ConfigMap) gives its mesh: Istio's default when it names none.
func MeshTrustDomain(doc string) string { return parseMeshConfig(doc).TrustDomain }

// MeshConfigKey is the key of the mesh config in istiod's ConfigMap.
const MeshConfigKey = meshConfigKey
