"""`helm test`: the extender answers a filter call as kube-scheduler sends it (ExtenderArgs with
NodeNames, nodeCacheCapable), and a reclaimer replica holds the Lease and keeps renewing it.
Standard library only; exits 1 naming what failed."""

import datetime
import json
import os
import ssl
import sys
import urllib.request

# In-cluster credentials and address, as client-go's in-cluster config reads them.
SA = os.environ.get("SERVICE_ACCOUNT_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")


def extender_answers() -> str | None:
    pod = {"metadata": {"name": "helm-test", "namespace": os.environ["POD_NAMESPACE"],
                        "uid": "helm-test"},
           "spec": {"containers": [{"name": "c", "resources": {
               "limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}]}}
    body = json.dumps({"Pod": pod, "NodeNames": []}).encode()
    request = urllib.request.Request(os.environ["EXTENDER_URL"] + "/filter", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        result = json.load(response)
    return None if not result.get("Error") else f"extender filter error: {result['Error']}"


def lease_held(name: str) -> str | None:
    namespace = os.environ["POD_NAMESPACE"]
    with open(f"{SA}/token", encoding="utf-8") as f:
        token = f.read().strip()
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    host = f"[{host}]" if ":" in host else host  # IPv6
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    url = f"https://{host}:{port}/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    with urllib.request.urlopen(request, timeout=10, context=context) as response:
        spec = json.load(response)["spec"]
    if not spec.get("holderIdentity"):
        return f"Lease {name} has no holder"
    if not spec.get("renewTime"):
        return f"Lease {name} held by {spec['holderIdentity']} was never renewed"
    renewed = datetime.datetime.fromisoformat(spec["renewTime"].replace("Z", "+00:00"))
    age = (datetime.datetime.now(datetime.UTC) - renewed).total_seconds()
    if age > 3 * spec.get("leaseDurationSeconds", 15):
        return f"Lease {name} held by {spec['holderIdentity']} was last renewed {age:.0f}s ago"
    return None


def main() -> int:
    problems = []
    for check, args in ((extender_answers, ()), (lease_held, (os.environ.get("LEASE"),))):
        if check is lease_held and not args[0]:
            continue
        try:
            problem = check(*args)
        except OSError as e:
            problem = f"{check.__name__}: {e}"
        if problem:
            problems.append(problem)
    for problem in problems:
        print(problem, file=sys.stderr)
    print("ok" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
