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
	return mc
}

// MeshTrustDomain is the trust domain a YAML mesh config (the `mesh` key of
// istiod's ConfigMap) gives its mesh: Istio's default when it names none.
func MeshTrustDomain(doc string) string { return parseMeshConfig(doc).TrustDomain }

// MeshConfigKey is the key of the mesh config in istiod's ConfigMap.
const MeshConfigKey = meshConfigKey
