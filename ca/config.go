package ca

import (
	"errors"
	"fmt"
	"strings"
)

// Alternative is one of a group of configuration fields of which one may be
// set (a file, an environment variable, or the value in memory).
type Alternative struct {
	Field string
	Set   bool
}

// ExactlyOne reports a group of alternatives of which more than one is set
// (naming those) or, unless missing is empty (an optional group), none
// (with the message missing). It never quotes a value, so it is safe for
// fields that hold secrets.
func ExactlyOne(missing string, alts ...Alternative) error {
	var set []string
	for _, a := range alts {
		if a.Set {
			set = append(set, a.Field)
		}
	}
	switch {
	case len(set) == 0 && missing != "":
		return errors.New(missing)
	case len(set) > 1:
		return fmt.Errorf("%s: only one may be set", strings.Join(set, ", "))
	}
	return nil
}
