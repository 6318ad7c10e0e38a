package all

import (
	"context"
	"errors"
	"fmt"
	"strings"

	common "github.com/relaymesh/relaymesh/api/common/v1alpha1"
	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/policy/admission"
	"github.com/relaymesh/relaymesh/translation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// What is in force.
//
// The server translates a user object only if admission allows it (its
// translation controller's in-process check, through Judge and Refusal),
// and only within its namespace's reach (ScopePolicies); what it leaves out
// is Invalid in its status and produces nothing. Every view that shows what
// is enforced — `relaymesh describe`, `relaymesh policy audit` (live and
// offline), the dashboard's Access page and its what-if — decides it here,
// with the same admission engine and the same rules, so that none of them
// shows a refused object as in force.

// Decider judges one object (admission.Engine.Decide). It MUST fail closed:
// a decision it could not make denies.
type Decider interface {
	Decide(ctx context.Context, req admission.Request) (admission.Decision, error)
}

// ErrNoAdmission means an InForceConfig has no Admission: a view that does
// not judge objects would show the ones the server refuses as in force.
var ErrNoAdmission = errors.New("no admission check: what is in force cannot be decided without one")

// InForceConfig says how a view decides which user objects are in force.
type InForceConfig struct {
	// AdminNamespace is the server's namespace: policies there may select
	// any Destination, others only their own namespace's (ScopePolicies).
	AdminNamespace string
	// Admission judges every user object as the server's in-process check
	// does, with the same rule sets where the view can read them (the
	// default ones are built in). Required.
	Admission Decider
	// NamespaceLabels are the labels of the user objects' namespaces, which
	// rules may read; a namespace missing here has none.
	NamespaceLabels map[string]map[string]string
	// ServerStatus also leaves out an object whose status, written by the
	// server for its current generation, is Invalid: the server may have
	// judged it with rule sets this view cannot read. For views of a live
	// management cluster; files in a repository carry no such status.
	ServerStatus bool
}

// Reasons an object is not in force, as they appear in its status.
const (
	refusedPrefix = "refused by admission, so it is not translated: "
	checkFailed   = "the admission check failed, so it is not translated: "
	serverInvalid = "the server reports it Invalid, so it is not translated: "
)

// InProcessUser is the user an in-process admission check is made for: the
// object is already stored, and who wrote it is not known.
const InProcessUser = "system:relaymesh:in-process-check"

// Refusal is the status message of an admission decision; "" when allowed.
// The server's in-process check and InForce word refusals alike, so
// RefusedByAdmission recognises both.
func Refusal(d admission.Decision, err error) string {
	switch {
	case err != nil:
		return checkFailed + err.Error()
	case !d.Allowed:
		return refusedPrefix + d.Message()
	}
	return ""
}

// InForce returns the user objects of in that the server translates (the
// discovered ones unchanged) and a report in which every user object left
// out is Invalid with the reason: refused by admission or, with
// ServerStatus, reported Invalid by the server. Namespace tenancy is left
// to Translate, as on the server.
func InForce(ctx context.Context, in *translation.Input, cfg InForceConfig) (*translation.Input, *translation.Report, error) {
	if cfg.Admission == nil {
		return nil, nil, ErrNoAdmission
	}
	r := translation.NewReport()
	var errs []error
	out := Judge(in, r, func(kind string, o metav1.Object, typed runtime.Object) string {
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", kind, o.GetNamespace(), o.GetName(), err))
			return checkFailed + err.Error()
		}
		obj["apiVersion"], obj["kind"] = networkingv1alpha1.GroupVersion.String(), kind
		d, err := cfg.Admission.Decide(ctx, admission.Request{Operation: admission.OperationCreate, Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName(),
			Object: obj, User: admission.User{Username: InProcessUser}, NamespaceLabels: cfg.NamespaceLabels[o.GetNamespace()]})
		if msg := Refusal(d, err); msg != "" {
			return msg
		}
		// Admitted here; the server may still have refused it (rule sets
		// this view cannot read), and says so in the status.
		if cfg.ServerStatus {
			if st := storedStatus(typed); st != nil && st.State == common.StateInvalid && st.ObservedGeneration == o.GetGeneration() {
				return serverInvalid + strings.Join(st.Errors, "; ")
			}
		}
		return ""
	})
	return out, r, errors.Join(errs...)
}

// TranslateInForce translates what is in force of in, as the server does:
// admission first (InForce), then namespace tenancy and the translators
// (Translate). It returns the input that was translated, the output, and
// one report with a status for every user object of in.
func TranslateInForce(ctx context.Context, in *translation.Input, cfg InForceConfig) (*translation.Input, *translation.Output, *translation.Report, error) {
	admitted, refused, err := InForce(ctx, in, cfg)
	if admitted == nil {
		return nil, nil, nil, err
	}
	out, r := Translate(admitted, cfg.AdminNamespace)
	r.Merge(refused)
	return admitted, out, r, err
}

// RefusedByAdmission says whether a status message is admission's refusal
// (or failure to judge), given by InForce or by the server (as InForce
// passes on the server's status).
func RefusedByAdmission(msg string) bool {
	msg = strings.TrimPrefix(msg, serverInvalid)
	return strings.HasPrefix(msg, refusedPrefix) || strings.HasPrefix(msg, checkFailed)
}

// LeftOut says whether a status message is one InForce gave an object it
// left out: refused by admission, or reported Invalid by the server.
func LeftOut(msg string) bool {
	return RefusedByAdmission(msg) || strings.HasPrefix(msg, serverInvalid)
}

// Judge returns in without the user objects refuse refuses (a non-empty
// message), each reported Invalid with its message: the one list of the
// kinds admission judges, for the server and for every view.
func Judge(in *translation.Input, r *translation.Report, refuse func(kind string, o metav1.Object, typed runtime.Object) string) *translation.Input {
	keep := func(kind string, o interface {
		metav1.Object
		runtime.Object
	}) bool {
		msg := refuse(kind, o, o)
		if msg == "" {
			return true
		}
		r.Invalid(translation.ObjectKey{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName()}, o.GetGeneration(), "%s", msg)
		return false
	}
	out := *in
	out.VirtualMeshes = filter(in.VirtualMeshes, func(i int) bool { return keep(translation.KindVirtualMesh, &in.VirtualMeshes[i]) })
	out.TrafficPolicies = filter(in.TrafficPolicies, func(i int) bool { return keep(translation.KindTrafficPolicy, &in.TrafficPolicies[i]) })
	out.AccessPolicies = filter(in.AccessPolicies, func(i int) bool { return keep(translation.KindAccessPolicy, &in.AccessPolicies[i]) })
	out.VirtualDestinations = filter(in.VirtualDestinations, func(i int) bool { return keep(translation.KindVirtualDestination, &in.VirtualDestinations[i]) })
	return &out
}

func filter[T any](xs []T, keep func(i int) bool) []T {
	var out []T
	for i := range xs {
		if keep(i) {
			out = append(out, xs[i])
		}
	}
	return out
}

// storedStatus is the status the server wrote on a user object.
func storedStatus(o runtime.Object) *common.Status {
	switch o := o.(type) {
	case *networkingv1alpha1.VirtualMesh:
		return &o.Status.Status
	case *networkingv1alpha1.TrafficPolicy:
		return &o.Status.Status
	case *networkingv1alpha1.AccessPolicy:
		return &o.Status.Status
	case *networkingv1alpha1.VirtualDestination:
		return &o.Status.Status
	}
	return nil
}
