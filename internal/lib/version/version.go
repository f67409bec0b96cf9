// Package version holds the build's version, set by the linker:
// -X knotless.dev/run/internal/lib/version.Version=v1.2.3
package version

// Version is the release this binary was built from.
var Version = "dev"
