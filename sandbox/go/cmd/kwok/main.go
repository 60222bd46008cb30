// Command kwok is sigs.k8s.io/kwok/cmd/kwok (v0.8.0, Apache-2.0) rebuilt in
// this module so it shares the pinned dependency graph and go.sum.
//
// One addition: the upstream kwok binary has no built-in Stages (kwokctl
// supplies them), so without -c/--config it exits with "no stages found".
// This wrapper then loads the same default Stages kwokctl uses:
// node-initialize, a node heartbeat (the lease variant when
// --node-lease-duration-seconds > 0, as kwokctl does) and pod-ready,
// pod-complete, pod-delete. `kwok default-stages [--lease]` prints them.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	nodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	nodeheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat"
	nodeheartbeatwithlease "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	podfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	"sigs.k8s.io/kwok/pkg/config"
	"sigs.k8s.io/kwok/pkg/kwok/cmd"
	"sigs.k8s.io/kwok/pkg/log"
	"sigs.k8s.io/kwok/pkg/utils/signals"
)

func defaultStages(lease bool) string {
	heartbeat := nodeheartbeat.DefaultNodeHeartbeat
	if lease {
		heartbeat = nodeheartbeatwithlease.DefaultNodeHeartbeatWithLease
	}
	docs := []string{
		nodefast.DefaultNodeInit, heartbeat,
		podfast.DefaultPodReady, podfast.DefaultPodComplete, podfast.DefaultPodDelete,
	}
	for i, doc := range docs {
		docs[i] = strings.TrimSpace(doc)
	}
	return strings.Join(docs, "\n---\n") + "\n"
}

// flagValue returns the value of --name / -short in args ("" and false if absent).
func flagValue(args []string, names ...string) (string, bool) {
	for i, arg := range args {
		if arg == "--" {
			break
		}
		for _, name := range names {
			if arg == name {
				if i+1 < len(args) {
					return args[i+1], true
				}
				return "", true
			}
			if value, ok := strings.CutPrefix(arg, name+"="); ok {
				return value, true
			}
		}
	}
	return "", false
}

// withDefaultStages writes the default Stages to a temporary file and adds it
// as --config when the command line names no config. The returned cleanup
// removes the file; kwok reads it while parsing flags.
func withDefaultStages() (func(), error) {
	args := os.Args[1:]
	if _, ok := flagValue(args, "--config", "-c"); ok {
		return func() {}, nil
	}
	lease := false
	if value, ok := flagValue(args, "--node-lease-duration-seconds"); ok {
		seconds, err := strconv.ParseUint(value, 10, 64)
		lease = err == nil && seconds > 0
	}
	file, err := os.CreateTemp("", "kwok-default-stages-*.yaml")
	if err != nil {
		return nil, err
	}
	defer file.Close()
	if _, err := file.WriteString(defaultStages(lease)); err != nil {
		_ = os.Remove(file.Name())
		return nil, err
	}
	os.Args = append(os.Args, "--config="+file.Name())
	return func() { _ = os.Remove(file.Name()) }, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "default-stages" {
		_, lease := flagValue(os.Args[2:], "--lease")
		fmt.Print(defaultStages(lease))
		return
	}
	cleanup, err := withDefaultStages()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kwok: writing default stages: %v\n", err)
		os.Exit(1)
	}

	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}

	ctx := signals.SetupSignalContext()
	ctx, logger := log.InitFlags(ctx, flagset)

	ctx, err = config.InitFlags(ctx, flagset)
	cleanup()
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flagset.FlagUsages()))
		logger.Error("Init config flags", "err", err)
		os.Exit(1)
	}

	command := cmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flagset)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		os.Exit(1)
	}
}
