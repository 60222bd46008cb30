// Command k8s is a multi-call binary holding the Kubernetes components used by
// the gpusteward sandbox: kube-apiserver, kube-scheduler,
// kube-controller-manager, etcd, and the kubelet and kube-proxy of its real
// nodes, all built from Go modules in one build (they share most packages).
//
//	k8s apiserver          [kube-apiserver flags]
//	k8s scheduler          [kube-scheduler flags]
//	k8s controller-manager [kube-controller-manager flags]
//	k8s kubelet            [kubelet flags]
//	k8s proxy              [kube-proxy flags]
//	k8s etcd               [etcd flags]
//	k8s version
//
// It also dispatches on its own name, so a symlink named kube-apiserver,
// kube-scheduler, kube-controller-manager, kubelet, kube-proxy or etcd works too.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	_ "time/tzdata" // CronJob time zones, as in upstream kube-apiserver/kube-controller-manager

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/component-base/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var commands = map[string]func() *cobra.Command{
	"apiserver":          apiserver.NewAPIServerCommand,
	"scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"controller-manager": controllermanager.NewControllerManagerCommand,
	"kubelet":            func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"proxy":              proxy.NewProxyCommand,
}

// The upstream program names, as each component's own os.Args[0].
var programs = map[string]string{
	"apiserver":          "kube-apiserver",
	"scheduler":          "kube-scheduler",
	"controller-manager": "kube-controller-manager",
	"kubelet":            "kubelet",
	"proxy":              "kube-proxy",
}

// Names accepted when the binary is invoked through a symlink.
var aliases = map[string]string{
	"kube-apiserver":          "apiserver",
	"kube-scheduler":          "scheduler",
	"kube-controller-manager": "controller-manager",
	"kubelet":                 "kubelet",
	"kube-proxy":              "proxy",
	"etcd":                    "etcd",
}

func usage() {
	fmt.Fprintf(os.Stderr, "usage: %s {apiserver|scheduler|controller-manager|kubelet|proxy|etcd|version} [flags]\n",
		filepath.Base(os.Args[0]))
}

func main() {
	name := filepath.Base(os.Args[0])
	sub, args := aliases[name], os.Args[1:]
	if sub == "" {
		if len(args) == 0 {
			usage()
			os.Exit(2)
		}
		sub, args = strings.TrimPrefix(args[0], "kube-"), args[1:]
	}

	switch sub {
	case "etcd":
		// etcdmain.Main expects os.Args-shaped input: program name first.
		etcdmain.Main(append([]string{"etcd"}, args...))
		return
	case "version", "--version", "-version":
		fmt.Println(version.Get().GitVersion)
		return
	case "help", "-h", "--help":
		usage()
		return
	}
	newCommand, ok := commands[sub]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown component %q\n", sub)
		usage()
		os.Exit(2)
	}
	// cobra reads os.Args[1:] by default; hand it only the component's flags.
	os.Args = append([]string{programs[sub]}, args...)
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
