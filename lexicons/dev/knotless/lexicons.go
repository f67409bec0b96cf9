// Package knotless holds the lexicons of the knotless records
// (dev.knotless.*) as JSON files, embedded for validation.
package knotless

import "embed"

// Files are the lexicon JSON files, one per record type.
//
//go:embed *.json
var Files embed.FS
