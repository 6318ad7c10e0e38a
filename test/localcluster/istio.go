package localcluster

// Istio's CRDs are read from the istio.io/api module this repository pins;
// this import keeps that module (and so the CRD file) in go.mod even before
// other packages use Istio's types.
import _ "istio.io/api/networking/v1"
