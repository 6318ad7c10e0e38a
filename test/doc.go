// Package test holds Relaymesh's end-to-end suites and the harness they run
// on: test/localcluster starts real kube-apiservers and etcd as processes,
// test/cmd/localcluster and test/cmd/demo are thin commands over it.
package test
