package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/alecthomas/kong"
	"github.com/posener/complete"
	"github.com/willabides/kongplete"
)

// Shell completion is kongplete's: the shell runs knotless-run itself
// with COMP_LINE set (bash's complete -C), and kongplete answers from
// the command tree. A CHECK argument is completed with the keys of the
// checks knotless-run runs would list.

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
		kongplete.WithExitFunc(func(int) { done = true }),
		kongplete.WithErrorHandler(func(error) {}),
	)
	return done
}

// checkPredictor offers the keys of the checks of the logged-in
// account's repositories, newest first; nothing when it cannot list
// them within a few seconds.
func checkPredictor(env *Env) complete.Predictor {
	return complete.PredictFunc(func(complete.Args) []string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		quiet := *env
		quiet.Logger = slog.New(slog.DiscardHandler)
		f, err := newFinder(ctx, &quiet, &ClientFlags{}, "")
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
