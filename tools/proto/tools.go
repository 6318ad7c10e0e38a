//go:build tools

// Package proto pins protoc-gen-go and protoc-gen-go-grpc for `make gen`.
package proto

import (
	_ "google.golang.org/grpc/cmd/protoc-gen-go-grpc"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
)
