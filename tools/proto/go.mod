// Module proto pins the protobuf code generators used by `make gen`.
module github.com/relaymesh/relaymesh/tools/proto

go 1.26

require (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2
	google.golang.org/protobuf v1.36.12
)
