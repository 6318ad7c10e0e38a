package dashboard

import (
	"slices"
	"sort"
	"time"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
)

// TrustMesh is a VirtualMesh's shared trust: its root, where a rotation
// is, and each mesh's intermediate and progress.
type TrustMesh struct {
	VirtualMesh string   `json:"virtualMesh"`
	State       string   `json:"state"`
	Errors      []string `json:"errors,omitempty"`
	// Shared is false for a VirtualMesh without shared trust.
	Shared          bool      `json:"shared"`
	Backend         string    `json:"backend,omitempty"`
	RootSubject     string    `json:"rootSubject,omitempty"`
	RootFingerprint string    `json:"rootFingerprint,omitempty"`
	RootNotAfter    time.Time `json:"rootNotAfter,omitzero"`
	RootMessage     string    `json:"rootMessage,omitempty"`
	Phase           string    `json:"phase"`
	// Step is what the meshes are asked to hold (0–3, see RotationStatus).
	Step             int32     `json:"step"`
	Rotating         bool      `json:"rotating"`
	AwaitingContinue bool      `json:"awaitingContinue"`
	Message          string    `json:"message,omitempty"`
	Since            time.Time `json:"since,omitzero"`
	SinceAgo         string    `json:"sinceAgo,omitempty"`
	OldRoot          string    `json:"oldRoot,omitempty"`
	NewRoot          string    `json:"newRoot,omitempty"`
	// Done is how many meshes acked Step, of Total.
	Done   int         `json:"done"`
	Total  int         `json:"total"`
	Meshes []TrustPart `json:"meshes"`
}

// TrustPart is one mesh of a VirtualMesh's shared trust.
type TrustPart struct {
	Mesh        string    `json:"mesh"`
	Cluster     string    `json:"cluster"`
	TrustDomain string    `json:"trustDomain,omitempty"`
	Serial      string    `json:"serial,omitempty"`
	NotAfter    time.Time `json:"notAfter,omitzero"`
	// Issuer says which root signed its intermediate: "new root", "old
	// root", "root" (no rotation) or its fingerprint.
	Issuer string `json:"issuer"`
	// Progress: "acked" or "waiting for its agent".
	Progress string `json:"progress"`
	Pending  bool   `json:"pending"`
}

// trustMeshes builds the Trust page, VirtualMeshes by namespace/name.
func trustMeshes(vms []networkingv1alpha1.VirtualMesh, now time.Time) []TrustMesh {
	out := make([]TrustMesh, 0, len(vms))
	for _, vm := range vms {
		t := TrustMesh{VirtualMesh: vm.Namespace + "/" + vm.Name, State: string(vm.Status.State), Errors: vm.Status.Errors,
			Phase: string(networkingv1alpha1.PhaseNotRotating), Meshes: []TrustPart{}}
		if t.State == "" {
			t.State = "Pending"
		}
		st := vm.Status.SharedTrust
		t.Shared = vm.Spec.MTLS != nil && vm.Spec.MTLS.Shared != nil
		if st != nil {
			t.Backend = backendOf(st.Root, vm.Spec.MTLS)
			t.RootSubject, t.RootFingerprint, t.RootMessage = st.RootSubject, st.RootFingerprint, st.Message
			if st.RootNotAfter != nil {
				t.RootNotAfter = st.RootNotAfter.UTC()
			}
		} else {
			t.Backend = backendOf(nil, vm.Spec.MTLS)
		}
		r := vm.Status.Rotation
		var pending []string
		if r != nil {
			t.Phase, t.Step, t.AwaitingContinue, t.Message = string(r.Phase), r.Step, r.AwaitingContinue, r.Message
			t.Rotating = rotating(r.Phase)
			t.OldRoot, t.NewRoot = r.OldRootFingerprint, r.NewRootFingerprint
			if r.LastTransitionTime != nil {
				t.Since = r.LastTransitionTime.UTC()
				t.SinceAgo = ago(t.Since, now)
			}
			pending = r.PendingMeshes
		}
		if st != nil {
			for _, m := range st.Meshes {
				p := TrustPart{Mesh: m.Mesh, Cluster: m.Cluster, TrustDomain: m.TrustDomain, Serial: m.Serial, NotAfter: m.NotAfter.UTC(),
					Issuer: issuerRole(m.Issuer, r, st.RootFingerprint), Progress: "acked", Pending: slices.Contains(pending, m.Mesh)}
				if p.Pending {
					p.Progress = "waiting for its agent"
				}
				t.Meshes = append(t.Meshes, p)
			}
		}
		sort.Slice(t.Meshes, func(i, j int) bool {
			return t.Meshes[i].Cluster+"/"+t.Meshes[i].Mesh < t.Meshes[j].Cluster+"/"+t.Meshes[j].Mesh
		})
		t.Total = len(t.Meshes)
		for _, m := range t.Meshes {
			if !m.Pending {
				t.Done++
			}
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VirtualMesh < out[j].VirtualMesh })
	return out
}

// rotating says whether a rotation is under way in phase.
func rotating(p networkingv1alpha1.RotationPhase) bool {
	switch p {
	case networkingv1alpha1.PhaseAddingNewRoot, networkingv1alpha1.PhasePropagatingNewIntermediate,
		networkingv1alpha1.PhaseDeletingOldRoot, networkingv1alpha1.PhaseRollingBack:
		return true
	}
	return false
}

func issuerRole(fp string, r *networkingv1alpha1.RotationStatus, inForce string) string {
	switch {
	case r != nil && fp != "" && fp == r.NewRootFingerprint:
		return "new root " + short(fp)
	case r != nil && fp != "" && fp == r.OldRootFingerprint:
		return "old root " + short(fp)
	case fp == inForce:
		return "root " + short(fp)
	}
	return short(fp)
}
