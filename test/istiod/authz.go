package istiod

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/relaymesh/relaymesh/test/internal/workloadapi/security"
)

// DecodeAuthorization is one Authorization istiod sent a ztunnel.
func DecodeAuthorization(r *anypb.Any) (*security.Authorization, error) {
	if r == nil {
		return nil, fmt.Errorf("not sent")
	}
	a := &security.Authorization{}
	if err := r.UnmarshalTo(a); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	return a, nil
}

// RenderGroups writes each group of a as one string, sorted, so that rule
// order (istiod does not promise one) does not matter: a group is its rules
// joined by " & " (all must hold), a rule its matches joined by " | " (any
// may), a match its conditions joined by "," (all must hold).
func RenderGroups(a *security.Authorization) []string {
	var groups []string
	for _, g := range a.GetGroups() {
		var rules []string
		for _, r := range g.GetRules() {
			var matches []string
			for _, m := range r.GetMatches() {
				matches = append(matches, renderMatch(m))
			}
			sort.Strings(matches)
			rules = append(rules, strings.Join(matches, " | "))
		}
		sort.Strings(rules)
		groups = append(groups, strings.Join(rules, " & "))
	}
	sort.Strings(groups)
	return groups
}

func renderMatch(m *security.Match) string {
	var c []string
	add := func(key string, sms []*security.StringMatch) {
		for _, s := range sms {
			switch {
			case s.GetExact() != "":
				c = append(c, key+"="+s.GetExact())
			case s.GetPrefix() != "":
				c = append(c, key+"="+s.GetPrefix()+"*")
			case s.GetSuffix() != "":
				c = append(c, key+"=*"+s.GetSuffix())
			default:
				c = append(c, key+"=present")
			}
		}
	}
	add("principal", m.GetPrincipals())
	add("notPrincipal", m.GetNotPrincipals())
	add("namespace", m.GetNamespaces())
	add("notNamespace", m.GetNotNamespaces())
	for _, sa := range m.GetServiceAccounts() {
		c = append(c, "serviceAccount="+sa.GetNamespace()+"/"+sa.GetServiceAccount())
	}
	for _, p := range m.GetDestinationPorts() {
		c = append(c, "port="+strconv.Itoa(int(p)))
	}
	for _, p := range m.GetNotDestinationPorts() {
		c = append(c, "notPort="+strconv.Itoa(int(p)))
	}
	if len(m.GetSourceIps())+len(m.GetNotSourceIps())+len(m.GetDestinationIps())+len(m.GetNotDestinationIps())+len(m.GetNotServiceAccounts())+len(m.GetExtensions()) > 0 {
		c = append(c, "other="+m.String())
	}
	sort.Strings(c)
	return strings.Join(c, ",")
}
