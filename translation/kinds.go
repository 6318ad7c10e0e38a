package translation

import (
	"errors"
	"fmt"
	"strings"
)

// Kinds of the user objects translation reads.
const (
	KindVirtualMesh        = "VirtualMesh"
	KindTrafficPolicy      = "TrafficPolicy"
	KindAccessPolicy       = "AccessPolicy"
	KindVirtualDestination = "VirtualDestination"
)

// ErrUnknownKind: a kind is not a user kind translation reads.
var ErrUnknownKind = errors.New("unknown kind")

// PolicyKind returns the user kind a command-line kind names (trafficpolicy,
// TrafficPolicy, trafficpolicies, tp...), or ErrUnknownKind.
func PolicyKind(s string) (string, error) {
	switch strings.ToLower(s) {
	case "trafficpolicy", "trafficpolicies", "tp":
		return KindTrafficPolicy, nil
	case "accesspolicy", "accesspolicies", "ap":
		return KindAccessPolicy, nil
	case "virtualmesh", "virtualmeshes", "vm":
		return KindVirtualMesh, nil
	case "virtualdestination", "virtualdestinations", "vd":
		return KindVirtualDestination, nil
	}
	return "", fmt.Errorf("%w %q: want trafficpolicy, accesspolicy, virtualmesh or virtualdestination", ErrUnknownKind, s)
}
