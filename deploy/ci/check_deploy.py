"""Offline checks of the deployment assets in deploy/ (run by scripts/check-deploy.sh).

Each manifest folder holds only objects, so `kubectl apply -f <folder>` works; Helm values
live in deploy/helm/.

Core Kubernetes objects are validated with kubernetes-validate (strict: unknown fields fail)
for one pinned Kubernetes version; custom resources against the JSON Schemas in
deploy/schemas/; helm values files only for their embedded EPP configs. Then what a schema
cannot see: probes on /health at the serving port, the shutdown arithmetic (preStop sleep +
--shutdown-timeout inside terminationGracePeriodSeconds, liveness slower than the grace
period), every `tokenmill serve` flag present in `tokenmill serve --help`, and the container
recipe building the binary with the command CI uses. `--self-test` breaks each of those on
purpose and fails unless every break is caught. With a model, `--smoke` runs the recipe's
command line on the CI binary and probes /health as its HEALTHCHECK does.
"""

import argparse
import copy
import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

KUBERNETES_VERSION = "1.33.0"
MANIFEST_DIRS = [
    "kubernetes", "kubernetes/monitoring", "kubernetes/optional", "gateway", "kserve", "helm",
]
SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-v1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime-v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-v1beta1.json",
}
HEALTH_PATH = "/health"
# After --shutdown-timeout the server aborts what is left (1 s grace), closes connections
# (1 s) and stops the engine; the rest is margin for a slow node.
SHUTDOWN_SLACK_S = 5
CI_BUILD_SCRIPT = "scripts/test-python.sh"


class Bundle:
    """Everything checked, loaded once so the self-test can break copies of it."""

    def __init__(self, root, help_text):
        self.root = root
        self.help_text = help_text
        self.docs = []  # (file, document)
        self.values = []  # (file, parsed helm values)
        for folder in MANIFEST_DIRS:
            for path in sorted((root / "deploy" / folder).glob("*.yaml")):
                rel = str(path.relative_to(root))
                loaded = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
                if folder == "helm":
                    self.values.extend((rel, d) for d in loaded)
                else:
                    self.docs.extend((rel, d) for d in loaded)
        self.containerfile = (root / "deploy" / "Containerfile").read_text()
        self.ci_build_script = (root / CI_BUILD_SCRIPT).read_text()


def check(bundle):
    """Every problem found, as `file: message` lines."""
    errors = [f"{rel}: {e}" for rel, doc in bundle.docs for e in check_schema(bundle.root, doc)]
    for rel, values in bundle.values:
        errors += [f"{rel}: {e}" for e in check_values(values)]
    if errors:
        # The checks below read fields the schemas guarantee.
        return errors
    for rel, doc in bundle.docs:
        errors += [f"{rel}: {e}" for e in check_serving(doc, bundle)]
    errors += [f"deploy/Containerfile: {e}" for e in check_containerfile(bundle)]
    if not any(doc.get("kind") == "HorizontalPodAutoscaler" for _, doc in bundle.docs):
        errors.append("deploy/kubernetes: no HorizontalPodAutoscaler")
    return errors


def describe(doc):
    return f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


def check_schema(root, doc):
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in SCHEMAS:
        schema = json.loads((root / "deploy" / "schemas" / SCHEMAS[key]).read_text())
        validator = jsonschema.Draft202012Validator(schema)
        return [
            f"{describe(doc)}: {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
            for e in validator.iter_errors(doc)
        ]
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return [f"{describe(doc)}: no schema for {key[0]} {key[1]} (add one to deploy/schemas)"]
    except kubernetes_validate.ValidationError as e:
        path = "/".join(map(str, e.path)) or "(root)"
        return [f"{describe(doc)}: {path}: {e.message}"]
    return []


def check_values(values):
    """The EndpointPickerConfig inside helm values: every pluginRef names a declared plugin."""
    errors = []
    extension = values.get("inferenceExtension") or {}
    configs = extension.get("pluginsCustomConfig") or {}
    chosen = extension.get("pluginsConfigFile")
    if chosen and chosen not in configs:
        errors.append(f"pluginsConfigFile {chosen} is not in pluginsCustomConfig")
    for name, text in configs.items():
        config = yaml.safe_load(text)
        if config.get("kind") != "EndpointPickerConfig":
            errors.append(f"{name}: not an EndpointPickerConfig")
            continue
        declared = {p.get("name", p["type"]) for p in config.get("plugins", [])}
        for profile in config.get("schedulingProfiles", []):
            for ref in profile.get("plugins", []):
                if ref["pluginRef"] not in declared:
                    errors.append(f"{name}: profile {profile['name']} uses undeclared {ref['pluginRef']}")
    return errors


def serving_containers(doc, bundle):
    """(container, its `tokenmill serve` args, the pod's grace seconds) per serving container."""
    kind = doc.get("kind")
    if kind == "Deployment":
        pod = doc["spec"]["template"]["spec"]
        grace = pod.get("terminationGracePeriodSeconds", 30)
        return [(c, c.get("args", []), grace) for c in pod["containers"]]
    if kind == "ServingRuntime":
        found = []
        for c in doc["spec"]["containers"]:
            services = [
                d for _, d in bundle.docs
                if d.get("kind") == "InferenceService"
                and d["spec"]["predictor"].get("model", {}).get("runtime") == doc["metadata"]["name"]
            ]
            if not services:
                found.append((c, c.get("args", []), 30))
            for service in services:
                predictor = service["spec"]["predictor"]
                args = c.get("args", []) + predictor["model"].get("args", [])
                found.append((c, args, predictor.get("terminationGracePeriodSeconds", 30)))
        return found
    return []


def check_serving(doc, bundle):
    errors = []
    if doc.get("kind") == "ServingRuntime":
        # Its containers are core/v1 containers: give them Kubernetes' own schema.
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "runtime"},
               "spec": {"containers": doc["spec"]["containers"]}}
        errors += [e.replace("Pod/runtime", describe(doc)) for e in check_schema(bundle.root, pod)]
    for container, args, grace in serving_containers(doc, bundle):
        where = f"{describe(doc)} container {container['name']}"
        errors += [f"{where}: {e}" for e in check_container(container, args, grace, bundle.help_text)]
    return errors


def check_container(container, args, grace, help_text):
    errors = check_flags(args, help_text)
    ports = container.get("ports", [])
    serve_port = int(flag_value(args, "--port") or help_default(help_text, "--port"))
    names = {p.get("name") for p in ports if p["containerPort"] == serve_port}
    if not names:
        errors.append(f"no container port {serve_port} (the --port it serves on)")
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(probe_name)
        http = (probe or {}).get("httpGet")
        if not http:
            errors.append(f"{probe_name}: missing or not an httpGet probe")
            continue
        if http.get("path") != HEALTH_PATH:
            errors.append(f"{probe_name}: path {http.get('path')!r}, tokenmill serves {HEALTH_PATH}")
        if http.get("port") != serve_port and http.get("port") not in names - {None}:
            errors.append(f"{probe_name}: port {http.get('port')!r} is not the serving port")
    command = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
    if not command or command[0] != "sleep":
        errors.append("preStop: expected an exec `sleep N` so endpoints drop the pod before SIGTERM")
        return errors
    pre_stop = int(command[1])
    timeout = int(flag_value(args, "--shutdown-timeout") or help_default(help_text, "--shutdown-timeout"))
    if grace < pre_stop + timeout + SHUTDOWN_SLACK_S:
        errors.append(
            f"terminationGracePeriodSeconds {grace} < preStop {pre_stop} + --shutdown-timeout "
            f"{timeout} + {SHUTDOWN_SLACK_S}: the drain would be cut by SIGKILL")
    liveness = container.get("livenessProbe") or {}
    window = liveness.get("periodSeconds", 10) * liveness.get("failureThreshold", 3)
    if window < grace:
        errors.append(
            f"liveness window {window} s < terminationGracePeriodSeconds {grace}: a draining pod "
            "(/health 503) could be killed before its requests finish")
    return errors


def flag_value(args, flag):
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def set_arg(args, flag, value):
    args[args.index(flag) + 1] = value


def help_default(help_text, flag):
    match = re.search(re.escape(flag) + r" <[A-Z_]+>\s+(?:.*\n)*?.*\[default: ([^\]]+)\]", help_text)
    if not match:
        raise SystemExit(f"`tokenmill serve --help` shows no default for {flag}")
    return match.group(1)


def check_flags(args, help_text):
    known = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text))
    flags = [arg.split("=")[0] for arg in args if arg.startswith("--")]
    errors = [f"`tokenmill serve` has no flag {flag}" for flag in flags if flag not in known]
    errors += [f"{flag} given twice" for flag in sorted(set(flags)) if flags.count(flag) > 1]
    return errors


def instructions(containerfile):
    """(keyword, argument text) per instruction, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", containerfile)
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def exec_form(text):
    return json.loads(text) if text.startswith("[") else shlex.split(text)


def check_containerfile(bundle):
    errors = []
    steps = instructions(bundle.containerfile)
    ci_builds = [line.strip() for line in bundle.ci_build_script.splitlines()
                 if line.strip().startswith("cargo build")]
    builds = [rest for kw, rest in steps if kw == "RUN" and rest.startswith("cargo build")]
    if len(ci_builds) != 1:
        errors.append(f"{CI_BUILD_SCRIPT} should have one `cargo build` line, has {len(ci_builds)}")
    elif builds != ci_builds:
        errors.append(f"build step {builds} is not CI's {ci_builds[0]!r} ({CI_BUILD_SCRIPT})")
    froms = [rest.split() for kw, rest in steps if kw == "FROM"]
    if len(froms) < 2 or [f[-1] for f in froms[:1]] != ["build"]:
        errors.append("expected a multi-stage recipe whose first stage is `AS build`")
    copies = [rest for kw, rest in steps if kw == "COPY" and rest.startswith("--from=build")]
    if not any("/target/release/tokenmill " in c + " " for c in copies):
        errors.append("the runtime stage does not copy target/release/tokenmill from the build stage")
    users = [rest for kw, rest in steps if kw == "USER"]
    if not users or users[-1] in ("0", "root"):
        errors.append("the runtime stage must run as a non-root USER")
    entrypoint = [exec_form(rest) for kw, rest in steps if kw == "ENTRYPOINT"]
    if entrypoint[-1:] != [["tokenmill", "serve"]]:
        errors.append(f"ENTRYPOINT should be [\"tokenmill\", \"serve\"], is {entrypoint[-1:]}")
    cmd = ([exec_form(rest) for kw, rest in steps if kw == "CMD"] or [[]])[-1]
    errors += check_flags(cmd, bundle.help_text)
    port = flag_value(cmd, "--port") or help_default(bundle.help_text, "--port")
    exposed = [rest.split("/")[0] for kw, rest in steps if kw == "EXPOSE"]
    if exposed != [port]:
        errors.append(f"EXPOSE {exposed} does not match the served port {port}")
    health = [rest for kw, rest in steps if kw == "HEALTHCHECK"]
    target = re.escape(f"http://127.0.0.1:{port}{HEALTH_PATH}") + r"(\s|$)"
    if not health or not re.search(target, health[-1]):
        errors.append(f"HEALTHCHECK should request http://127.0.0.1:{port}{HEALTH_PATH}")
    members = read_members(bundle.root)
    if members != ["crates/*"]:
        errors.append(f"workspace members {members}: the build stage copies only crates/")
    return errors


def read_members(root):
    text = (root / "Cargo.toml").read_text()
    match = re.search(r"members\s*=\s*(\[[^\]]*\])", text)
    return json.loads(match.group(1)) if match else None


def epp_values(bundle):
    return next(v["inferenceExtension"] for _, v in bundle.values if "inferenceExtension" in v)


def first(bundle, kind):
    return next(doc for _, doc in bundle.docs if doc.get("kind") == kind)


def deployment_container(bundle):
    return first(bundle, "Deployment")["spec"]["template"]["spec"]["containers"][0]


# Each break must be reported; the names say what a regression would look like.
BREAKS = {
    "readiness probe on a wrong path": lambda b: deployment_container(b)["readinessProbe"]["httpGet"].update(path="/healthz"),
    "liveness probe on a wrong port": lambda b: deployment_container(b)["livenessProbe"]["httpGet"].update(port=9000),
    "probe removed": lambda b: deployment_container(b).pop("startupProbe"),
    "misspelt Deployment field": lambda b: deployment_container(b).update(readinesProbe={}),
    "flag tokenmill lacks": lambda b: deployment_container(b)["args"].append("--enable-sleep-mode"),
    "grace shorter than the drain": lambda b: first(b, "Deployment")["spec"]["template"]["spec"].update(terminationGracePeriodSeconds=20),
    "shutdown timeout longer than the grace": lambda b: set_arg(deployment_container(b)["args"], "--shutdown-timeout", "120"),
    "flag given twice": lambda b: deployment_container(b)["args"].extend(["--port", "8000"]),
    "liveness faster than the grace": lambda b: deployment_container(b)["livenessProbe"].update(failureThreshold=2),
    "InferencePool port out of range": lambda b: first(b, "InferencePool")["spec"]["targetPorts"][0].update(number=0),
    "InferencePool without endpointPickerRef": lambda b: first(b, "InferencePool")["spec"].pop("endpointPickerRef"),
    "InferencePool of the old v1alpha2 shape": lambda b: first(b, "InferencePool")["spec"].update(targetPortNumber=8000),
    "ServingRuntime container with a bad probe": lambda b: first(b, "ServingRuntime")["spec"]["containers"][0]["readinessProbe"]["httpGet"].update(port="eighty"),
    "InferenceService without a model format": lambda b: first(b, "InferenceService")["spec"]["predictor"]["model"].pop("modelFormat"),
    "ServiceMonitor interval not a duration": lambda b: first(b, "ServiceMonitor")["spec"]["endpoints"][0].update(interval="often"),
    "HPA without scale target": lambda b: first(b, "HorizontalPodAutoscaler")["spec"].pop("scaleTargetRef"),
    "unknown kind": lambda b: b.docs.append(("deploy/kubernetes/x.yaml", {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "x"}})),
    "EPP config file not among the custom configs": lambda b: epp_values(b).update(pluginsConfigFile="missing.yaml"),
    "EPP profile naming an undeclared plugin": lambda b: epp_values(b)["pluginsCustomConfig"].update({"x.yaml": "kind: EndpointPickerConfig\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"}),
    "recipe builds differently from CI": lambda b: setattr(b, "containerfile", b.containerfile.replace("cargo build --release -p tokenmill", "cargo build --release")),
    "recipe runs as root": lambda b: setattr(b, "containerfile", b.containerfile.replace("USER 10001", "USER 0")),
    "recipe health check on another path": lambda b: setattr(b, "containerfile", b.containerfile.replace(":8000/health", ":8000/healthz")),
}


def self_test(bundle):
    failures = []
    for name, breaker in BREAKS.items():
        broken = copy.deepcopy(bundle)
        breaker(broken)
        found = check(broken)
        if not found:
            failures.append(name)
        else:
            print(f"  caught {name}: {found[0]}")
    return failures


def smoke(bundle, binary, model):
    """Runs the recipe's CMD on the CI binary and probes /health like its HEALTHCHECK."""
    cmd = ([exec_form(rest) for kw, rest in instructions(bundle.containerfile) if kw == "CMD"])[-1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    args = [port if prev == "--port" else arg for prev, arg in zip([None] + cmd, cmd)]
    argv = [binary, "serve", *args, "--model", model, "--kv-cache-memory", "64MiB",
            "--max-model-len", "256", "--threads", "1", "--disable-log-stats"]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}{HEALTH_PATH}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url, timeout=3) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                return [f"`{' '.join(argv)}` never answered {url}: {server.stderr.read()[-2000:]}"]
            time.sleep(0.2)
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        return [] if code == 0 else [f"the server exited {code} on SIGTERM"]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--smoke-model", help="a model for the recipe smoke run")
    options = parser.parse_args()
    help_text = subprocess.run([options.binary, "serve", "--help"], check=True,
                               capture_output=True, text=True).stdout
    bundle = Bundle(options.root.resolve(), help_text)
    errors = check(bundle)
    for error in errors:
        print(f"error: {error}")
    if errors:
        return 1
    print(f"ok: {len(bundle.docs)} objects, {len(bundle.values)} values files, the Containerfile")
    if options.self_test:
        failures = self_test(bundle)
        for name in failures:
            print(f"error: self-test: {name} was not caught")
        if failures:
            return 1
    if options.smoke_model:
        failures = smoke(bundle, options.binary, options.smoke_model)
        for error in failures:
            print(f"error: smoke: {error}")
        if failures:
            return 1
        print("ok: the recipe's command line serves /health and drains on SIGTERM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
