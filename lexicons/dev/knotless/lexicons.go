// Package knotless holds the lexicons of the knotless records
// (dev.knotless.*) as JSON files, embedded for validation.
package knotless

import "embed"

// Files are the lexicon JSON files: one per record type, one per XRPC
// method (the run output ones), and dev.knotless.defs.
//
//go:embed *.json
var Files embed.FS
