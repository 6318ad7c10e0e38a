// Package kubeutil holds the few Kubernetes helpers several packages share.
package kubeutil

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// UpsertSecret creates want, or replaces the data, labels and type of the
// existing Secret of that name (a Secret's type is immutable, so a type
// change deletes and recreates it).
func UpsertSecret(ctx context.Context, client kubernetes.Interface, want *corev1.Secret) error {
	secrets := client.CoreV1().Secrets(want.Namespace)
	cur, err := secrets.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = secrets.Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if cur.Type != want.Type {
		if err := secrets.Delete(ctx, want.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID}}); err != nil {
			return err
		}
		_, err = secrets.Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	cur.Data = want.Data
	if cur.Labels == nil {
		cur.Labels = map[string]string{}
	}
	for k, v := range want.Labels {
		cur.Labels[k] = v
	}
	_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}
