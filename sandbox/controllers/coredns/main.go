// Command coredns is CoreDNS with the few plugins the sandbox's cluster DNS uses: the
// Service and pod records of the kubernetes plugin, bound to the real nodes' host ends.
// Upstream's main (github.com/coredns/coredns/coredns.go) links every plugin (cloud DNS
// providers among them); this one sets the directive list to the plugins it imports, in
// upstream's plugin.cfg order.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"bind", "ready", "errors", "kubernetes"}
}

func main() {
	coremain.Run()
}
