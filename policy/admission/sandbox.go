package admission

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"
)

// unsafeBuiltins are refused to every rule: they reach the network or the
// host, or read the clock, which would let the webhook and the in-process
// check disagree. Built-ins OPA marks non-deterministic are refused too
// (capabilities).
var unsafeBuiltins = map[string]struct{}{
	"http.send":          {},
	"net.lookup_ip_addr": {},
	"opa.runtime":        {},
	"trace":              {},
	// JSON schema references may be fetched over the network.
	"json.verify_schema": {},
	"json.match_schema":  {},
	// Both check validity against the current time.
	"io.jwt.decode_verify":                                   {},
	"crypto.x509.parse_and_verify_certificates":              {},
	"crypto.x509.parse_and_verify_certificates_with_options": {},
}

// capabilities are OPA's for this version without the unsafe and
// non-deterministic built-ins, and with no network access for the compiler.
var capabilities = sync.OnceValue(func() *ast.Capabilities {
	c := ast.CapabilitiesForThisVersion()
	c.Builtins = slices.DeleteFunc(slices.Clone(c.Builtins), func(b *ast.Builtin) bool {
		_, unsafe := unsafeBuiltins[b.Name]
		return unsafe || b.Nondeterministic
	})
	c.AllowNet = []string{}
	return c
})

// removedBuiltins are the built-ins of this OPA version that rules may not
// call, sorted.
var removedBuiltins = sync.OnceValue(func() []string {
	var out []string
	for _, b := range ast.CapabilitiesForThisVersion().Builtins {
		if !capabilities().ContainsBuiltin(b.Name) {
			out = append(out, b.Name)
		}
	}
	slices.Sort(out)
	return out
})

// explainRemoved adds to a compile error that a function it calls undefined
// exists but is not available to admission rules.
func explainRemoved(err error) error {
	msg := err.Error()
	for _, name := range removedBuiltins() {
		if strings.Contains(msg, "undefined function "+name+"\n") || strings.HasSuffix(msg, "undefined function "+name) {
			return fmt.Errorf("%w (%s is not available to admission rules: built-ins that reach the network or host, or are not deterministic, are disabled)", err, name)
		}
	}
	return err
}

// newCompiler returns a compiler for rules: Rego v1, restricted built-ins,
// print statements dropped.
func newCompiler() *ast.Compiler {
	return ast.NewCompiler().
		WithCapabilities(capabilities()).
		WithEnablePrintStatements(false).
		WithDefaultRegoVersion(ast.RegoV1)
}
