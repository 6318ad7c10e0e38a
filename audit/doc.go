// Package audit is Relaymesh's security audit log: an append-only file of
// JSON lines, one per security-relevant event (bootstrap token minted, used
// or refused; certificate issued, renewed or denied; cluster registered or
// revoked; admission decision; CA rotation step), chained by SHA-256 so that
// `relaymesh audit verify FILE` can tell whether the file was changed.
//
// # Format
//
// Each line is one Record, encoded exactly as encoding/json encodes it and
// terminated by "\n":
//
//	{"seq":1,"time":"2026-11-22T10:00:00Z","type":"token.mint","result":"success","cluster":"east","prev":"000…000","hash":"9f2c…"}
//
// The fields always appear in this order: seq, time, type, result, cluster,
// subject, serial, peer, reason, details, prev, hash; empty optional fields
// are left out. Seq counts from 1 without gaps. Time is UTC in RFC 3339 with
// nanoseconds (trailing zeros dropped). Details keys are sorted. Strings are
// valid UTF-8 with no control characters, and '<', '>' and '&' are escaped
// as encoding/json does.
//
// Prev is the Hash of the line before; on line 1 it is 64 zeros. Hash is
//
//	hex(SHA-256(prev || C))
//
// where prev is the 64 hex characters of Prev and C is the line itself
// (without "\n") with the hash value emptied, that is ending in `"hash":""}`.
// A verifier in another language needs only these rules: decode the line,
// check seq and prev, blank the hash, hash, compare.
//
// # Guarantees
//
// Verify reads a whole log and rejects it, naming the first bad line, when a
// line was edited (its hash no longer matches), deleted, inserted or moved
// (seq or prev no longer follows), or is not byte for byte the canonical
// encoding of the record it holds (extra spaces, reordered or duplicated
// keys, unknown fields, different escapes). Open runs the same check before
// it appends, so the server never extends a broken chain.
//
// # Limitations
//
// Removing lines from the end of the file leaves a valid, shorter chain:
// truncation of the tail is only detectable against a head (record count
// and hash) recorded somewhere else, which Log.Head and Summary provide for
// that purpose. Likewise the chain uses no key: whoever can write the file
// can rewrite all of it and recompute every hash. The chain makes changes
// evident, not impossible; anchoring the head outside the host (a remote log,
// a ticket, a metric) from time to time is what makes a rewrite detectable.
//
// A Log assumes it is the only writer of its file. There is no file lock:
// two Logs on one file, in one process or two, would both continue from the
// same head and fork the chain, which Verify then reports as broken.
//
// Events MUST NOT contain secrets: a token appears by its ID or hash, never
// its value, and keys not at all. The package cannot tell a secret from
// other text, so this is the callers' rule; its own error messages name
// fields, never their values.
package audit
