package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/posener/complete"
	"github.com/willabides/kongplete"

	"knotless.dev/run/internal/forge"
	"knotless.dev/run/internal/forge/pdsclient"
)

// Shell completion is kongplete's: the shell runs knotless-run itself
// with COMP_LINE set (bash's complete -C), and kongplete answers from
// the command tree. A CHECK argument is completed with the keys of the
// checks knotless-run runs would list with the --repo (and --plc-url)
// typed on the line; a --repo with the names of the logged-in account's
// repositories.

// completionHooks are the lines each shell needs to ask knotless-run
// (kongplete's install fragments, for BIN).
var completionHooks = map[string]string{
	"bash": "complete -C %[1]q %[2]s\n",
	"zsh":  "autoload -U +X bashcompinit && bashcompinit\ncomplete -C %[1]q %[2]s\n",
	"fish": "function __complete_%[2]s\n    set -lx COMP_LINE (commandline -cp)\n    test -z (commandline -ct)\n    and set COMP_LINE \"$COMP_LINE \"\n    %[1]q\nend\ncomplete -f -c %[2]s -a \"(__complete_%[2]s)\"\n",
}

// CompletionCmd prints the shell's completion hook.
type CompletionCmd struct {
	Shell string `arg:"" enum:"bash,zsh,fish" help:"The shell: bash, zsh or fish."`
}

// Help is completion --help's text below its usage line.
func (CompletionCmd) Help() string {
	return "Add its output to your shell's start-up: bash: knotless-run completion bash >> ~/.bashrc; " +
		"zsh: knotless-run completion zsh >> ~/.zshrc; fish: knotless-run completion fish > ~/.config/fish/completions/knotless-run.fish."
}

// Run prints the hook.
func (c *CompletionCmd) Run(env *Env) error {
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this program's path: %w", err)
	}
	fmt.Fprintf(env.Stdout, completionHooks[c.Shell], bin, "knotless-run")
	return nil
}

// completeLine answers a shell's completion request (COMP_LINE set) and
// reports whether it did.
func completeLine(parser *kong.Kong, env Env) bool {
	if env.Getenv == nil || env.Getenv("COMP_LINE") == "" {
		return false
	}
	done := false
	kongplete.Complete(parser,
		kongplete.WithPredictor("check", checkPredictor(&env)),
		kongplete.WithPredictor("repo", repoPredictor(&env)),
		kongplete.WithExitFunc(func(int) { done = true }),
		kongplete.WithErrorHandler(func(error) {}),
	)
	return done
}

// predictWithin is how long a predictor may read records: past it the
// shell is offered nothing rather than kept waiting.
const predictWithin = 5 * time.Second

// checkPredictor offers the keys of the checks knotless-run runs lists
// with the --repo and --plc-url typed on the line (without --repo: of
// the logged-in account's repositories), newest first; nothing when it
// cannot list them within predictWithin.
func checkPredictor(env *Env) complete.Predictor {
	return complete.PredictFunc(func(a complete.Args) []string {
		ctx, cancel := context.WithTimeout(context.Background(), predictWithin)
		defer cancel()
		quiet := *env
		quiet.Logger = slog.New(slog.DiscardHandler)
		f, err := newFinder(ctx, &quiet, &ClientFlags{PLCURL: typedFlag(a, "plc-url")}, typedFlag(a, "repo"))
		if err != nil {
			return nil
		}
		all, err := f.all(ctx, &quiet)
		if err != nil {
			return nil
		}
		var keys []string
		for _, c := range all {
			keys = append(keys, c.Key)
		}
		return keys
	})
}

// repoPredictor offers the names of the logged-in account's
// repositories, as --repo takes them (NAME, one of yours); nothing when
// it cannot list them within predictWithin.
func repoPredictor(env *Env) complete.Predictor {
	return complete.PredictFunc(func(a complete.Args) []string {
		ctx, cancel := context.WithTimeout(context.Background(), predictWithin)
		defer cancel()
		quiet := *env
		quiet.Logger = slog.New(slog.DiscardHandler)
		s, _, err := loadSession(&quiet)
		if err != nil {
			return nil
		}
		r, err := (&ClientFlags{PLCURL: typedFlag(a, "plc-url")}).reader(&quiet)
		if err != nil {
			return nil
		}
		repos, _, err := pdsclient.List[forge.Repo](ctx, r, s.AccountDID, forge.CollectionRepo)
		if err != nil {
			return nil
		}
		var names []string
		for _, rec := range repos {
			names = append(names, rec.URI.RecordKey().String())
		}
		return names
	})
}

// typedFlag is the value of the flag --name on the line being
// completed, as --name VALUE or --name=VALUE (the last one typed);
// "" when it is not there.
func typedFlag(a complete.Args, name string) string {
	v := ""
	for i, w := range a.Completed {
		switch {
		case w == "--"+name && i+1 < len(a.Completed):
			v = a.Completed[i+1]
		case strings.HasPrefix(w, "--"+name+"="):
			v = strings.TrimPrefix(w, "--"+name+"=")
		}
	}
	return v
}
