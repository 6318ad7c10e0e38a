#!/usr/bin/env bash
# Generates Go for istiod's workload API (the protos it serves ztunnel:
# istio.workload.Address and istio.security.Authorization) into
# test/internal/workloadapi, from the Istio module tools/istio pins. Tests
# decode istiod's delta xDS with it; the main module does not require
# istio.io/istio. Needs protoc and protoc-gen-go on PATH (make gen).
set -euo pipefail
cd "$(dirname "$0")/.."
istio=$(cd tools/istio && go list -m -f '{{.Dir}}' istio.io/istio)
api=$(go list -m -f '{{.Dir}}' istio.io/api)
out=test/internal
pkg=github.com/relaymesh/relaymesh/$out
rm -f $out/workloadapi/workload.pb.go $out/workloadapi/security/authorization.pb.go
protoc -I "$istio/pkg" -I "$api/common-protos" \
	--go_out=$out --go_opt=module=$pkg \
	--go_opt=Mworkloadapi/workload.proto=$pkg/workloadapi \
	--go_opt=Mworkloadapi/security/authorization.proto=$pkg/workloadapi/security \
	--go_opt=Mgoogle/protobuf/empty.proto=google.golang.org/protobuf/types/known/emptypb \
	--go_opt=Mgoogle/protobuf/any.proto=google.golang.org/protobuf/types/known/anypb \
	--go_opt=Mgoogle/protobuf/wrappers.proto=google.golang.org/protobuf/types/known/wrapperspb \
	workloadapi/workload.proto workloadapi/security/authorization.proto
