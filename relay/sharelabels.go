package relay

import (
	"github.com/relaymesh/relaymesh/internal/sharedlabels"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
)

// ShareLabels makes the endpoints of s with equal labels share one map. A
// Service's endpoints are its ready pods, the pods of one Deployment carry
// the same labels, and every Service selecting them repeats them: decoded,
// a 100,000-pod snapshot held 200,000 endpoint label maps, of which 10,000
// differed (docs/benchmarks.md, "100,000 pods held"). The snapshot is read
// only from then on, as an accepted snapshot already is.
func ShareLabels(s *relaypb.Snapshot) {
	var tab sharedlabels.Table
	shareEndpointLabels(&tab, s.GetDestinations())
}

func shareEndpointLabels(tab *sharedlabels.Table, ds []*relaypb.Destination) {
	for _, d := range ds {
		for _, e := range d.GetEndpoints() {
			e.Labels = tab.Share(e.Labels)
		}
	}
}
