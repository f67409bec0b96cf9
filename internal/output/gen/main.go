// Command gen writes internal/output/cbor_gen.go, the DAG-CBOR coding of
// the dev.knotless.subscribeRunOutput frames, with whyrusleeping/cbor-gen
// as indigo codes its own event streams. Run it with go generate in
// internal/output.
package main

import (
	"fmt"
	"os"

	cbg "github.com/whyrusleeping/cbor-gen"

	"knotless.dev/run/internal/output"
)

func main() {
	g := cbg.Gen{MaxArrayLength: 16384, MaxByteLength: 1 << 20, MaxStringLength: 8192}
	if err := g.WriteMapEncodersToFile("cbor_gen.go", "output",
		output.FrameHeader{}, output.ErrorFrame{}, output.WireMark{}, output.Chunk{}, output.Gap{}, output.End{}, output.RunFrame{},
	); err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
}
