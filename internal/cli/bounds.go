package cli

import (
	"knotless.dev/run/internal/engine/run"
	"knotless.dev/run/internal/lib/tarstream"
)

// BoundFlags bound what a run moves between the runner and its session,
// so no run can fill the runner's disk; run and the daemon share them.
// Sizes are of the tar stream, in bytes; 0 means tarstream's default
// (2 GiB, 200,000 entries), never no bound.
type BoundFlags struct {
	MaxCheckout int64 `help:"Most bytes of a run's checkout sent into its session (as a tar stream); past it the run ends error. 0: 2 GiB." default:"2147483648" placeholder:"BYTES" group:"bounds"`
	MaxOutputs  int64 `help:"Most bytes of a run's outputs brought back (as a tar stream); past it the run ends error and no output is kept. 0: 2 GiB." default:"1073741824" placeholder:"BYTES" group:"bounds"`
	MaxFiles    int64 `help:"Most files, directories and links in a run's checkout, and in its outputs. 0: 200000." default:"200000" placeholder:"N" group:"bounds"`
}

// bounds are the flags as the engine takes them, named after the flags
// in the error a run ends with.
func (f BoundFlags) bounds() (checkout, outputs run.Bound) {
	checkout = run.Bound{Limits: tarstream.Limits{MaxBytes: f.MaxCheckout, MaxFiles: f.MaxFiles}, BytesName: "--max-checkout", FilesName: "--max-files"}
	outputs = run.Bound{Limits: tarstream.Limits{MaxBytes: f.MaxOutputs, MaxFiles: f.MaxFiles}, BytesName: "--max-outputs", FilesName: "--max-files"}
	return checkout, outputs
}

// exportBound is --max-checkout as the mirror's export limit (summed file
// sizes, checked before anything is written): one flag bounds both the
// export and the tar stream, and 0 is the same default for both.
func exportBound(maxCheckout int64) int64 {
	return tarstream.Limits{MaxBytes: maxCheckout}.Effective().MaxBytes
}

// transfer is the executor's own bound on every transfer, a backstop
// behind the engine's and the cache store's exact ones: the largest of
// them (cacheMax is --cache-max), so it never cuts what they let
// through.
func (f BoundFlags) transfer(cacheMax int64) tarstream.Limits {
	eff := func(b int64) int64 { return tarstream.Limits{MaxBytes: b}.Effective().MaxBytes }
	return tarstream.Limits{
		MaxBytes: max(eff(f.MaxCheckout), eff(f.MaxOutputs), eff(cacheMax)),
		MaxFiles: tarstream.Limits{MaxFiles: f.MaxFiles}.Effective().MaxFiles,
	}
}
