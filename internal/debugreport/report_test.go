package debugreport

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSafeName(t *testing.T) {
	for in, want := range map[string]string{
		"cluster-1":                            "cluster-1",
		"arn:aws:eks:eu-west-1:1:cluster/prod": "arn_aws_eks_eu-west-1_1_cluster_prod",
		"../../etc":                            ".._.._etc",
		"..":                                   "_..",
		"":                                     "_",
		"a\\b c":                               "a_b_c",
		"kind-µ":                               "kind-__",
	} {
		assert.Equal(t, want, SafeName(in), in)
	}
}
