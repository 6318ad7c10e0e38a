//go:build cgo

package hsm

import (
	"errors"

	"github.com/miekg/pkcs11"
)

// cgoBuild: this binary can load PKCS#11 modules.
const cgoBuild = true

// loginErrors explains the PKCS#11 return values of a failed login.
var loginErrors = map[pkcs11.Error]string{
	pkcs11.CKR_PIN_INCORRECT:            "wrong PIN (CKR_PIN_INCORRECT)",
	pkcs11.CKR_PIN_INVALID:              "the PIN has characters the token does not accept (CKR_PIN_INVALID)",
	pkcs11.CKR_PIN_LEN_RANGE:            "the PIN is too long or too short for the token (CKR_PIN_LEN_RANGE)",
	pkcs11.CKR_PIN_LOCKED:               "the PIN is locked after too many wrong attempts (CKR_PIN_LOCKED)",
	pkcs11.CKR_PIN_EXPIRED:              "the PIN has expired (CKR_PIN_EXPIRED)",
	pkcs11.CKR_USER_PIN_NOT_INITIALIZED: "the token's user PIN is not initialized (CKR_USER_PIN_NOT_INITIALIZED)",
}

// loginError explains err if it carries a PKCS#11 login return value.
func loginError(err error) (string, bool) {
	var code pkcs11.Error
	if !errors.As(err, &code) {
		return "", false
	}
	msg, ok := loginErrors[code]
	return msg, ok
}
