package trust

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/relaymesh/relaymesh/api/outputs"
	relaypb "github.com/relaymesh/relaymesh/relay/proto"
	"go.step.sm/crypto/pemutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Restarting pods after a mesh's CA changed (VirtualMesh
// spec.mtls.autoRestartPods). A "CA state" is a digest of the issuer, the
// root bundle and ca-cert.pem of a cacerts Secret; every record below names
// the CA state it was made for, so a new intermediate or a new root starts
// over, and the same one is never restarted for twice.
const (
	// RestartedAtAnnotation, on a pod template, is when the agent restarted
	// its pods (the way `kubectl rollout restart` does with its own
	// annotation).
	RestartedAtAnnotation = "relaymesh.io/restartedAt"
	// CAStateAnnotation, on a pod template, is the CA state its pods were
	// restarted for. A Deployment that carries the current one is not
	// restarted again, so work cut short by an error or an agent restart
	// resumes where it stopped.
	CAStateAnnotation = "relaymesh.io/ca-state"

	// RestartedIstiodAnnotation, on the cacerts Secret, is the CA state
	// istiod was restarted for; IstiodRestartedAtAnnotation is when
	// (RFC 3339).
	RestartedIstiodAnnotation   = "relaymesh.io/restarted-istiod"
	IstiodRestartedAtAnnotation = "relaymesh.io/istiod-restarted-at"
	// RestartedWorkloadsAnnotation, on the cacerts Secret, is the CA state
	// whose workload restarts are finished (or given up).
	RestartedWorkloadsAnnotation = "relaymesh.io/restarted-workloads"

	// RootCertConfigMap is the ConfigMap istiod writes into every namespace
	// with the roots its workloads trust (key root-cert.pem).
	RootCertConfigMap = "istio-ca-root-cert"

	// restartRecheck is how soon to look again while restarts are pending.
	restartRecheck = 5 * time.Second
	// rootCertWait is how long after restarting istiod the agent waits for
	// a namespace's istio-ca-root-cert to carry the root bundle before it
	// gives that namespace up (and says so in the log).
	rootCertWait = 10 * time.Minute
	// maxRestartObjects bounds one call: each List reads at most this many
	// objects (istiod Deployments, injected namespaces, istio-ca-root-cert
	// ConfigMaps, Deployments of one namespace), and at most this many
	// Deployments are restarted; the rest wait for the next call, 5s later.
	// Namespaces beyond the first maxRestartObjects injected ones (by name)
	// and Deployments beyond the first maxRestartObjects of a namespace are
	// left out, with a warning in the log.
	maxRestartObjects = 1000
	// maxLoggedNamespaces bounds the namespaces named in one log line.
	maxLoggedNamespaces = 50
)

// Istio's labels and annotations read here (as in discovery).
const (
	istioAppLabel        = "app"
	istiodApp            = "istiod"
	istioInjectionLabel  = "istio-injection"
	istioInjectionOn     = "enabled"
	istioRevisionLabel   = "istio.io/rev"
	istioInjectKey       = "sidecar.istio.io/inject" // label or annotation
	istioRootCertMapFile = "root-cert.pem"
)

// restartPods restarts istiod and then the mesh's workloads after its CA
// changed, when req.RestartPods asks for it. It returns when to look again
// (zero: nothing pending).
//
// Step 1 restarts the Deployments labelled app=istiod in req.Namespace.
// Step 2, from the next call on, restarts the sidecar-injected Deployments
// of every injected namespace whose istio-ca-root-cert carries every root
// of req.RootBundle; a namespace that still does not 10 minutes after the
// istiod restart is given up. Progress is recorded on the cacerts Secret
// (with its resourceVersion, so a concurrent change fails the update
// instead of being overwritten) and on each restarted pod template. A
// cacerts Secret not labelled with a.Owner is never read further or
// changed, and nothing is restarted for it.
func (a *Agent) restartPods(ctx context.Context, req *relaypb.TrustRequest, now time.Time) (time.Time, error) {
	cur, err := a.Client.CoreV1().Secrets(req.GetNamespace()).Get(ctx, SecretName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// Deleted since it was written: the next Apply writes it again.
		return time.Time{}, nil
	case err != nil:
		return time.Time{}, fmt.Errorf("read %s/%s: %w", req.GetNamespace(), SecretName, err)
	case cur.Labels[outputs.OwnerLabel] != a.Owner:
		return time.Time{}, nil
	}
	state := caState(cur)
	istiodAt, err := time.Parse(time.RFC3339, cur.Annotations[IstiodRestartedAtAnnotation])
	if cur.Annotations[RestartedIstiodAnnotation] != state || err != nil {
		if err := a.restartIstiod(ctx, req, state, now); err != nil {
			return time.Time{}, err
		}
		err := a.record(ctx, cur, map[string]string{
			RestartedIstiodAnnotation:   state,
			IstiodRestartedAtAnnotation: now.UTC().Format(time.RFC3339),
		})
		if err != nil {
			return time.Time{}, err
		}
		return now.Add(restartRecheck), nil
	}
	if cur.Annotations[RestartedWorkloadsAnnotation] == state {
		return time.Time{}, nil
	}
	done, err := a.restartWorkloads(ctx, req, state, istiodAt, now)
	if err != nil {
		return time.Time{}, err
	}
	if !done {
		return now.Add(restartRecheck), nil
	}
	if err := a.record(ctx, cur, map[string]string{RestartedWorkloadsAnnotation: state}); err != nil {
		return time.Time{}, err
	}
	return time.Time{}, nil
}

// caState is the digest of what a change of the mesh's CA changes: the
// issuer, the root bundle and the intermediate (all public).
func caState(s *corev1.Secret) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(s.Annotations[IssuerAnnotation]), s.Data[KeyRootCert], s.Data[KeyCACert]} {
		// Length-prefixed, so no two different triples share a digest input.
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(part))))
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// restartIstiod restarts the istiod Deployments of req's namespace not yet
// restarted for state.
func (a *Agent) restartIstiod(ctx context.Context, req *relaypb.TrustRequest, state string, now time.Time) error {
	list, err := a.Client.AppsV1().Deployments(req.GetNamespace()).List(ctx, metav1.ListOptions{
		LabelSelector: istioAppLabel + "=" + istiodApp, Limit: maxRestartObjects})
	if err != nil {
		return fmt.Errorf("list istiod Deployments in %s: %w", req.GetNamespace(), err)
	}
	if len(list.Items) == 0 {
		a.log().Info("no istiod Deployment to restart after the mesh CA changed", "namespace", req.GetNamespace(), "mesh", req.GetMesh())
	}
	for i := range list.Items {
		if _, err := a.restart(ctx, req, &list.Items[i], state, now); err != nil {
			return err
		}
	}
	return nil
}

// restartWorkloads restarts, within the bound of one call, the injected
// Deployments of the namespaces whose istio-ca-root-cert carries req's
// root bundle. It reports whether nothing is left to do for state.
func (a *Agent) restartWorkloads(ctx context.Context, req *relaypb.TrustRequest, state string, istiodAt, now time.Time) (bool, error) {
	bundle, err := pemutil.ParseCertificateBundle(req.GetRootBundle())
	if err != nil || len(bundle) == 0 {
		return false, errors.New("root bundle is not PEM certificates")
	}
	namespaces, nsLeftOut, err := a.injectedNamespaces(ctx)
	if err != nil {
		return false, err
	}
	roots, err := a.rootCerts(ctx, namespaces)
	if err != nil {
		return false, err
	}
	var (
		waiting []string
		budget  = maxRestartObjects
		more    bool
	)
	for _, ns := range namespaces {
		if !carries(roots[ns], bundle) {
			waiting = append(waiting, ns)
			continue
		}
		if budget == 0 {
			more = true
			continue
		}
		n, pending, err := a.restartNamespace(ctx, req, ns, state, now, budget)
		if err != nil {
			return false, err
		}
		budget -= n
		more = more || pending
	}
	if more {
		return false, nil
	}
	if len(waiting) > 0 {
		if now.Before(istiodAt.Add(rootCertWait)) {
			return false, nil
		}
		a.log().Warn("gave up waiting for istio-ca-root-cert to carry the new root bundle: restart these namespaces' workloads by hand",
			"mesh", req.GetMesh(), "waited", rootCertWait, "count", len(waiting), "namespaces", waiting[:min(len(waiting), maxLoggedNamespaces)])
	}
	if nsLeftOut {
		a.log().Warn("more injected namespaces than one pass considers: workloads of the namespaces beyond were not restarted",
			"mesh", req.GetMesh(), "considered", len(namespaces))
	}
	return true, nil
}

// restartNamespace restarts at most budget injected Deployments of ns not
// yet restarted for state. It returns how many it restarted and whether
// more are left for the next call.
func (a *Agent) restartNamespace(ctx context.Context, req *relaypb.TrustRequest, ns, state string, now time.Time, budget int) (int, bool, error) {
	list, err := a.Client.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{Limit: maxRestartObjects})
	if err != nil {
		return 0, false, fmt.Errorf("list Deployments in %s: %w", ns, err)
	}
	if list.Continue != "" {
		a.log().Warn("more Deployments than one pass considers: those beyond were not restarted", "namespace", ns, "considered", len(list.Items))
	}
	n := 0
	for i := range list.Items {
		d := &list.Items[i]
		if ns == req.GetNamespace() && d.Labels[istioAppLabel] == istiodApp {
			continue // istiod had its own restart
		}
		if optsOut(&d.Spec.Template) || d.Spec.Template.Annotations[CAStateAnnotation] == state {
			continue
		}
		if n == budget {
			return n, true, nil
		}
		restarted, err := a.restart(ctx, req, d, state, now)
		if err != nil {
			return n, false, err
		}
		if restarted {
			n++
		}
	}
	return n, false, nil
}

// restart restarts d's pods for state, as `kubectl rollout restart` does,
// unless they already were. It reports whether it changed d.
func (a *Agent) restart(ctx context.Context, req *relaypb.TrustRequest, d *appsv1.Deployment, state string, now time.Time) (bool, error) {
	if d.Spec.Template.Annotations[CAStateAnnotation] == state {
		return false, nil
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{RestartedAtAnnotation: now.UTC().Format(time.RFC3339), CAStateAnnotation: state}}}}})
	if err != nil {
		return false, fmt.Errorf("restart patch: %w", err)
	}
	_, err = a.Client.AppsV1().Deployments(d.Namespace).Patch(ctx, d.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("restart Deployment %s/%s: %w", d.Namespace, d.Name, err)
	}
	a.log().Info("restarted after the mesh CA changed", "mesh", req.GetMesh(), "namespace", d.Namespace, "deployment", d.Name)
	return true, nil
}

// injectedNamespaces lists, by name, the namespaces whose pods Istio
// injects by default: labelled istio-injection=enabled, or istio.io/rev
// without an istio-injection label (which takes precedence, as in Istio's
// webhook selectors). Namespaces being deleted are left out. It reports
// whether some were left out by the bound.
func (a *Agent) injectedNamespaces(ctx context.Context) ([]string, bool, error) {
	var (
		names   []string
		leftOut bool
	)
	for _, sel := range []string{istioInjectionLabel + "=" + istioInjectionOn, istioRevisionLabel} {
		list, err := a.Client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: sel, Limit: maxRestartObjects})
		if err != nil {
			return nil, false, fmt.Errorf("list injected namespaces: %w", err)
		}
		leftOut = leftOut || list.Continue != ""
		for _, ns := range list.Items {
			if _, ok := ns.Labels[istioInjectionLabel]; (ok && sel == istioRevisionLabel) || ns.DeletionTimestamp != nil {
				continue
			}
			names = append(names, ns.Name)
		}
	}
	slices.Sort(names)
	if len(names) > maxRestartObjects {
		names, leftOut = names[:maxRestartObjects], true
	}
	return names, leftOut, nil
}

// rootCerts returns the root-cert.pem of the istio-ca-root-cert ConfigMap
// of each of namespaces that has one.
func (a *Agent) rootCerts(ctx context.Context, namespaces []string) (map[string]string, error) {
	list, err := a.Client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + RootCertConfigMap, Limit: maxRestartObjects})
	if err != nil {
		return nil, fmt.Errorf("list %s ConfigMaps: %w", RootCertConfigMap, err)
	}
	roots := make(map[string]string, len(list.Items))
	for _, cm := range list.Items {
		roots[cm.Namespace] = cm.Data[istioRootCertMapFile]
	}
	if list.Continue == "" {
		return roots, nil
	}
	// More namespaces than one List reads: fetch the injected ones missed.
	for _, ns := range namespaces {
		if _, ok := roots[ns]; ok {
			continue
		}
		cm, err := a.Client.CoreV1().ConfigMaps(ns).Get(ctx, RootCertConfigMap, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("read %s/%s: %w", ns, RootCertConfigMap, err)
		default:
			roots[ns] = cm.Data[istioRootCertMapFile]
		}
	}
	return roots, nil
}

// carries reports whether rootCertPEM (an istio-ca-root-cert's
// root-cert.pem) holds every certificate of bundle, in any order. Content
// that does not parse carries nothing.
func carries(rootCertPEM string, bundle []*x509.Certificate) bool {
	have, err := pemutil.ParseCertificateBundle([]byte(rootCertPEM))
	if err != nil {
		return false
	}
	for _, want := range bundle {
		if !slices.ContainsFunc(have, want.Equal) {
			return false
		}
	}
	return true
}

// optsOut reports whether a pod template refuses injection: the label
// sidecar.istio.io/inject, else the annotation of that name, is "false".
func optsOut(tmpl *corev1.PodTemplateSpec) bool {
	v := tmpl.Labels[istioInjectKey]
	if v != "true" && v != "false" {
		v = tmpl.Annotations[istioInjectKey]
	}
	return v == "false"
}

// record adds annotations to the cacerts Secret cur; the update carries
// cur's resourceVersion, so it fails rather than overwrite a change made
// since cur was read.
func (a *Agent) record(ctx context.Context, cur *corev1.Secret, annotations map[string]string) error {
	next := cur.DeepCopy()
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	maps.Copy(next.Annotations, annotations)
	if _, err := a.Client.CoreV1().Secrets(cur.Namespace).Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("record restarts on %s/%s: %w", cur.Namespace, SecretName, err)
	}
	return nil
}
