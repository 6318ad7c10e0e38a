package translation_test

import (
	"testing"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	discoveryv1alpha1 "github.com/relaymesh/relaymesh/api/discovery/v1alpha1"
	"github.com/relaymesh/relaymesh/translation"
	"github.com/stretchr/testify/assert"
)

func TestSelectors(t *testing.T) {
	d := &discoveryv1alpha1.Destination{Spec: discoveryv1alpha1.DestinationSpec{KubeService: discoveryv1alpha1.KubeService{
		Ref:    common.ClusterObjectRef{Name: "reviews", Namespace: "bookinfo", ClusterName: "cluster-1"},
		Labels: map[string]string{"app": "reviews"},
	}}}
	for name, tt := range map[string]struct {
		sels []common.DestinationSelector
		want bool
	}{
		"none selects all":  {nil, true},
		"labels match":      {[]common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "reviews"}}}}, true},
		"labels differ":     {[]common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Labels: map[string]string{"app": "ratings"}}}}, false},
		"other cluster":     {[]common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Clusters: []string{"cluster-2"}}}}, false},
		"namespace matches": {[]common.DestinationSelector{{KubeServiceMatcher: &common.KubeServiceMatcher{Namespaces: []string{"bookinfo"}}}}, true},
		"ref matches":       {[]common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "reviews", Namespace: "bookinfo", ClusterName: "cluster-1"}}}}}, true},
		"ref other cluster": {[]common.DestinationSelector{{KubeServiceRefs: &common.KubeServiceRefs{Services: []common.ClusterObjectRef{{Name: "reviews", Namespace: "bookinfo", ClusterName: "cluster-2"}}}}}, false},
	} {
		assert.Equal(t, tt.want, translation.MatchDestination(tt.sels, d), name)
	}
	assert.Equal(t, "reviews.bookinfo.svc.cluster-1.global", translation.FederatedHostname(d, ""))
	assert.Equal(t, "reviews.bookinfo.svc.cluster.local", translation.LocalHostname(d, ""))
	assert.True(t, translation.MatchIdentity(nil, "c", "n", "sa"))
	assert.True(t, translation.MatchIdentity([]common.IdentitySelector{{KubeServiceAccountRefs: &common.KubeServiceAccountRefs{ServiceAccounts: []common.ClusterObjectRef{{Name: "sa", Namespace: "n", ClusterName: "c"}}}}}, "c", "n", "sa"))
	assert.False(t, translation.MatchIdentity([]common.IdentitySelector{{KubeIdentityMatcher: &common.KubeIdentityMatcher{Namespaces: []string{"other"}}}}, "c", "n", "sa"))
}
