package trust

import (
	"context"
	"errors"

	networkingv1alpha1 "github.com/relaymesh/relaymesh/api/networking/v1alpha1"
	"github.com/relaymesh/relaymesh/ca"
)

// pkcs11Signer opens the root of a rootCA.pkcs11. The string is a version
// of what it read (the Secrets' resourceVersions): a changed version means
// the signer must be opened anew.
func (c *Controller) pkcs11Signer(ctx context.Context, p *networkingv1alpha1.PKCS11CA) (ca.Signer, string, error) {
	return nil, "", errors.New("pkcs11 roots are not wired into the server yet")
}

// externalSigner connects to the CA service of a rootCA.external.
func (c *Controller) externalSigner(ctx context.Context, e *networkingv1alpha1.ExternalCA) (ca.Signer, string, error) {
	return nil, "", errors.New("external roots are not wired into the server yet")
}
