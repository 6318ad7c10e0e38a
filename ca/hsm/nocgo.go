//go:build !cgo

package hsm

// cgoBuild: without cgo no PKCS#11 module can be loaded; New refuses every
// token with ErrNoCgo.
const cgoBuild = false

// loginError: without cgo there are no PKCS#11 return values to explain.
func loginError(error) (string, bool) { return "", false }
