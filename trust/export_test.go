package trust

import (
	"log/slog"
	"time"
)

// NewControllerForTest returns a Controller that watches and publishes
// nothing: enough to open the roots a VirtualMesh names.
func NewControllerForTest(cfg Config) *Controller {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Controller{cfg: cfg, log: cfg.Logger.With("component", "trust")}
}

// PKCS11Signer and ExternalSigner open the roots of rootCA.pkcs11 and
// rootCA.external.
var (
	PKCS11Signer   = (*Controller).pkcs11Signer
	ExternalSigner = (*Controller).externalSigner
)
