package cli

import "knotless.dev/run/internal/parts/live"

// LiveFlags are serve's live output (live.Config): the runner's own
// listener, and the output service it pushes to.
type LiveFlags struct {
	Listen           string `help:"Serve the runs' live output on this address: dev.knotless.getRunOutput, subscribeRunOutput and getRunFile, and the page /runs/DID/KEY (plain HTTP: put a TLS proxy in front of it for readers elsewhere)." placeholder:"ADDR" group:"live output"`
	PublicURL        string `name:"public-url" help:"The base URL readers reach the live output at, written in each running check (default: --output-service when set, else http:// and the --listen address)." placeholder:"URL" group:"live output"`
	OutputService    string `help:"Push each run's live output and files to this output service (knotless-run output-service), outbound only, authenticated with service-auth tokens from the runner's PDS." placeholder:"URL" group:"live output"`
	OutputServiceDID string `name:"output-service-did" help:"The output service's DID, the audience of the runner's tokens (with --output-service)." placeholder:"DID" group:"live output"`
}

// live maps the flags onto live.Config (the bounds are its defaults).
func (f *LiveFlags) live() live.Config {
	return live.Config{Listen: f.Listen, PublicURL: f.PublicURL, Service: f.OutputService, ServiceDID: f.OutputServiceDID}
}
