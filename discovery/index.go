package discovery

// labelIndex answers "which of these label sets does a selector match" for
// the label sets of one namespace, without scanning them all: it keeps a
// posting list per (key, value) pair and checks only the sets in the
// shortest list among the selector's pairs.
type labelIndex struct {
	sets     []map[string]string
	postings map[labelPair][]int // ascending indexes into sets
}

type labelPair struct{ key, value string }

func newLabelIndex(sets []map[string]string) *labelIndex {
	x := &labelIndex{sets: sets, postings: map[labelPair][]int{}}
	for i, set := range sets {
		for k, v := range set {
			p := labelPair{k, v}
			x.postings[p] = append(x.postings[p], i)
		}
	}
	return x
}

// match returns, in ascending order, the indexes of the sets that contain
// every pair of sel. An empty selector matches nothing (Services without a
// selector select no pods).
func (x *labelIndex) match(sel map[string]string) []int {
	if len(sel) == 0 {
		return nil
	}
	var shortest []int
	first := true
	for k, v := range sel {
		list := x.postings[labelPair{k, v}]
		if len(list) == 0 {
			return nil
		}
		if first || len(list) < len(shortest) {
			shortest, first = list, false
		}
	}
	var out []int
	for _, i := range shortest {
		if matches(sel, x.sets[i]) {
			out = append(out, i)
		}
	}
	return out
}

// matches reports whether labels contain every pair of sel.
func matches(sel, labels map[string]string) bool {
	for k, v := range sel {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
