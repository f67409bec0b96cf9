// Command kube is a multi-call binary holding the Kubernetes components the
// test cluster runs: kube-apiserver, kube-controller-manager, kube-scheduler
// and kubelet. They share one compile, which keeps the cold build of the
// harness to one link of k8s.io/kubernetes.
//
// The component is chosen by the name the binary was called by (a symlink
// named after the component) or by its first argument:
//
//	kube kube-apiserver --etcd-servers=...
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // for timeZone support in CronJob

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func commands(ctx context.Context) map[string]func() *cobra.Command {
	return map[string]func() *cobra.Command{
		"kube-apiserver":          apiserver.NewAPIServerCommand,
		"kube-controller-manager": controllermanager.NewControllerManagerCommand,
		"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(ctx) },
	}
}

func main() {
	os.Exit(run(context.Background(), os.Args))
}

func run(ctx context.Context, args []string) int {
	cmds := commands(ctx)
	if newCmd, ok := cmds[filepath.Base(args[0])]; ok {
		return cli.Run(newCmd())
	}
	if len(args) > 1 {
		if newCmd, ok := cmds[args[1]]; ok {
			cmd := newCmd()
			cmd.SetArgs(args[2:])
			return cli.Run(cmd)
		}
	}
	fmt.Fprintln(os.Stderr, "usage: kube {kube-apiserver|kube-controller-manager|kube-scheduler|kubelet} [flags]")
	return 2
}
