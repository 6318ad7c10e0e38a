// Package ca is Relaymesh's certificate authority: it issues agent client
// certificates, the relay server certificate and per-mesh intermediate CAs,
// always as template → sign → validate the result, from a signer behind a
// small interface (generated root, provided secret, PKCS#11, cfssl, step-ca,
// Vault). It also drives the MultiRoot root-rotation state machine.
//
// Status: not yet implemented; the agent-trust and shared-trust issues build
// it. Nothing in the product imports it yet.
package ca
