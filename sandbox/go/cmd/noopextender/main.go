// Command noopextender is the benchmark's protocol floor: a kube-scheduler HTTP
// extender that does nothing but speak the protocol. It decodes each request
// into the upstream wire types (k8s.io/kube-scheduler/extender/v1), passes every
// candidate node on /filter and scores every node 0 on /prioritize. Whatever
// throughput the scheduler reaches with it is the most any extender can reach
// on the same machine; benchmarks/bench_scheduler.py compares gpusteward to it.
//
// Usage: noopextender --listen 127.0.0.1:PORT
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net/http"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// decode reads the scheduler's ExtenderArgs; a body that is not one is a 400,
// as a real extender would answer.
func decode(w http.ResponseWriter, r *http.Request) (*extenderv1.ExtenderArgs, bool) {
	var args extenderv1.ExtenderArgs
	if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, false
	}
	return &args, true
}

func reply(w http.ResponseWriter, body any) {
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(body); err != nil {
		log.Printf("write reply: %v", err)
	}
}

// filter passes every candidate, in the shape the scheduler sent them:
// node names when nodeCacheCapable, full Node objects otherwise.
func filter(w http.ResponseWriter, r *http.Request) {
	args, ok := decode(w, r)
	if !ok {
		return
	}
	reply(w, extenderv1.ExtenderFilterResult{
		Nodes: args.Nodes, NodeNames: args.NodeNames, FailedNodes: extenderv1.FailedNodesMap{},
	})
}

// prioritize scores every candidate 0, so the scheduler's own scores decide.
func prioritize(w http.ResponseWriter, r *http.Request) {
	args, ok := decode(w, r)
	if !ok {
		return
	}
	var names []string
	if args.NodeNames != nil {
		names = *args.NodeNames
	} else if args.Nodes != nil {
		for i := range args.Nodes.Items {
			names = append(names, args.Nodes.Items[i].Name)
		}
	}
	scores := make(extenderv1.HostPriorityList, 0, len(names))
	for _, name := range names {
		scores = append(scores, extenderv1.HostPriority{Host: name})
	}
	reply(w, scores)
}

func main() {
	listen := flag.String("listen", "127.0.0.1:8888", "address to serve the extender on")
	flag.Parse()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", filter)
	mux.HandleFunc("POST /prioritize", prioritize)
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })
	log.Fatal(http.ListenAndServe(*listen, mux))
}
