package istiod

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// SetEndpointReady writes a pod's readiness where Kubernetes would (no
// kubelet or endpoint controller runs in a test cluster): the pod's Ready
// condition, and an EndpointSlice named after the pod for service holding
// the pod at ip on the named port (created, or updated in place), which
// istiod reads a Service's endpoints from.
func SetEndpointReady(ctx context.Context, cs kubernetes.Interface, ns, pod, service, ip, portName string, port int32, ready bool) error {
	p, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return err
	}
	status := corev1.ConditionTrue
	if !ready {
		status = corev1.ConditionFalse
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("pod %s/%s status: %w", ns, pod, err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: pod, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready, Terminating: new(false)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
			NodeName:   new(p.Spec.NodeName),
		}},
		Ports: []discoveryv1.EndpointPort{{Name: new(portName), Port: new(port), Protocol: new(corev1.ProtocolTCP)}},
	}
	cur, err := cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		_, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
	} else {
		slice.ResourceVersion = cur.ResourceVersion
		_, err = cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("EndpointSlice %s/%s: %w", ns, pod, err)
	}
	return nil
}
