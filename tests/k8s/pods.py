"""Runs StatefulSet manifests for real, in containers, with podman:
configs/k8s/statefulsets.yaml or what `pstrain k8s-manifest` writes.

A kubelet in miniature for the test: it builds the image's runtime stage
from configs/k8s/Containerfile (its own lines, with the daemons built here
in place of the build stage's), then starts every StatefulSet pod of the
manifests in that image (whatever image they name) as the manifests say
(hostname and DNS name <pod>.<service> on one network, the template's env,
ports, probes and volumes, every PersistentVolumeClaim as one shared
directory, ConfigMaps and Secrets as files), restarts a
pod whose process exits (restartPolicy Always, with Kubernetes' doubling
back-off from 10 s), runs the readiness and liveness probes over the pods'
addresses, and stops everything when the chief logs "training finished", as
the manifest's header tells users to. The base image is Debian 12 from
Debian's archive (mmdebstrap), imported as debian:12-slim: no registry is
reached.

  pods.py --work DIR --bin_dir DIR --k8s_dir DIR --data DIR [--manifest FILE]...
          [--secret NAME=DIR]... [--configmap NAME=DIR]... [--kill_chief_after_checkpoint]
          [--timeout S] [--name NET] [--image_cache FILE]
  pods.py --work DIR --name NET --cleanup   removes what a killed run left

Prints one line per event ("READY pstrain-ps-0 4.1", "EXIT pstrain-chief-0 137",
"RESTART pstrain-chief-0", "FINISHED 23.4") and ends with "SUMMARY <json>",
the chief's summary.json. Exits 0 when training finished, 1 otherwise;
everything it started is removed however it ends.
"""

import argparse
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request

import yaml

IMAGE = "localhost/pstrain:test"
BASE = "docker.io/library/debian:12-slim"
# What configs/k8s/Containerfile's runtime stage copies from the build stage;
# the test copies the daemons built here instead.
BUILD_COPY = "COPY --from=build /out/ /usr/local/bin/"


class Podman:
    """podman with storage, networks and settings of the run's own."""

    def __init__(self, work, name):
        self.root = os.path.join(work, "storage")
        # podman refuses a run root longer than 50 characters.
        self.runroot = "/tmp/%s-run" % name
        conf = os.path.join(work, "containers.conf")
        # runc: crun cannot set up cgroups in this kernel's hybrid hierarchy.
        # Limits of 4096: with podman's defaults, or even 50,000 processes,
        # the runtime's setrlimit is refused here (no CAP_SYS_RESOURCE).
        with open(conf, "w") as f:
            f.write('[containers]\ndefault_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n'
                    '[engine]\nruntime = "runc"\nhelper_binaries_dir = ["/usr/lib/podman"]\n'
                    '[network]\nnetwork_config_dir = "%s"\n' % os.path.join(work, "networks"))
        path = os.environ.get("PATH", "/usr/bin:/bin")
        self.env = dict(os.environ, CONTAINERS_CONF=conf,
                        PATH="/usr/local/sbin:/usr/sbin:/sbin:" + path)

    def argv(self, *args):
        return ["podman", "--root", self.root, "--runroot", self.runroot, *args]

    def run(self, *args, timeout=120, check=True):
        r = subprocess.run(self.argv(*args), env=self.env, capture_output=True, text=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError("podman %s: exit %d: %s" % (" ".join(args[:2]), r.returncode,
                                                           (r.stderr or r.stdout).strip()[-2000:]))
        return r.stdout


def say(*words):
    print(*words, flush=True)


def build_image(podman, work, bin_dir, k8s_dir, deadline, cache=None):
    """Builds the image; with `cache`, a file `podman save` wrote after an
    earlier build from the same binaries, loads that instead, and writes it
    after a build."""
    def left():
        return max(1.0, deadline - time.time())
    started = time.time()
    if cache and os.path.exists(cache):
        podman.run("load", "--quiet", "-i", cache, timeout=left())
        say("IMAGE %s loaded from %s in %.0f s" % (IMAGE, cache, time.time() - started))
        return
    tar = os.path.join(work, "debian12.tar")
    r = subprocess.run(["mmdebstrap", "--variant=minbase", "--quiet", "bookworm", tar,
                        "http://deb.debian.org/debian"], capture_output=True, text=True,
                       timeout=left(), env=podman.env)
    if r.returncode != 0:
        raise RuntimeError("mmdebstrap: " + (r.stderr or r.stdout)[-2000:])
    podman.run("import", tar, BASE, timeout=left())
    os.remove(tar)
    # The Containerfile's last stage, reading the daemons from the context.
    lines = open(os.path.join(k8s_dir, "Containerfile")).read().splitlines()
    last = max(i for i, l in enumerate(lines) if l.startswith("FROM "))
    stage = lines[last:]
    if BUILD_COPY not in stage:
        raise RuntimeError("the Containerfile's runtime stage has no line '%s'" % BUILD_COPY)
    stage[stage.index(BUILD_COPY)] = "COPY out/ /usr/local/bin/"
    context = os.path.join(work, "context")
    os.makedirs(os.path.join(context, "out"))
    os.makedirs(os.path.join(context, "configs/k8s"))
    for name in ("chief", "ps_server", "worker", "pstrain"):
        shutil.copy(os.path.join(bin_dir, name), os.path.join(context, "out", name))
    shutil.copy(os.path.join(k8s_dir, "entrypoint.sh"), os.path.join(context, "configs/k8s"))
    with open(os.path.join(context, "Containerfile"), "w") as f:
        f.write("\n".join(stage) + "\n")
    podman.run("build", "--quiet", "-t", IMAGE, "-f", os.path.join(context, "Containerfile"),
               context, timeout=left())
    size = podman.run("image", "inspect", IMAGE, "--format", "{{.Size}}").strip()
    say("IMAGE %s %.1f MB, built in %.0f s, the base included"
        % (IMAGE, int(size) / 1e6, time.time() - started))
    if cache:
        # Only a time saver: a save that fails leaves no file, and the run goes on.
        part = cache + ".part"
        try:
            if os.path.exists(part):
                os.remove(part)  # podman's archive writer refuses an existing file
            podman.run("save", "--quiet", "-o", part, IMAGE, timeout=min(60.0, left()))
            os.rename(part, cache)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            print("image cache not written: %s" % e, file=sys.stderr)
            if os.path.exists(part):
                os.remove(part)


class Pod:
    def __init__(self, name, service, container, volumes):
        self.name = name
        self.service = service
        self.container = container
        self.volumes = volumes
        self.ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        self.address = None  # on the pods' network, looked up once per start
        self.ready_at = None
        self.exited_at = None
        self.backoff = 10.0  # Kubernetes' crash back-off: 10 s, doubling, at most 300 s
        self.probe_failures = 0
        self.last_liveness = 0.0

    def env(self):
        out = []
        for e in self.container.get("env", []):
            if "value" in e:
                out.append("%s=%s" % (e["name"], e["value"]))
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                out.append("%s=%s" % (e["name"], self.name))
            else:
                raise RuntimeError("%s: env %s: only values and metadata.name are simulated"
                                   % (self.name, e["name"]))
        return out


def read_dir(path):
    """A directory's files by name, as `kubectl create ... --from-file=DIR` takes them."""
    return {f: open(os.path.join(path, f)).read() for f in sorted(os.listdir(path))}


def volume_dir(work, kind, name, files, mode):
    """A Secret's or ConfigMap's files in a directory of their own, as the
    kubelet mounts them (mode: the volume's defaultMode)."""
    d = os.path.join(work, "volumes", kind, name)
    os.makedirs(d, exist_ok=True)
    for key, text in files.items():
        path = os.path.join(d, key)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
    return d


def pods_of(work, docs, data, secrets, config_maps):
    """The pods of every StatefulSet in `docs`, with their volumes as host
    paths: every PersistentVolumeClaim is `data`; a Secret is the files of
    secrets[name] (a directory the test made, as `kubectl create secret
    --from-file` would take them), missing allowed only where the volume is
    optional (an empty directory then); a ConfigMap is the manifest's own
    object or the files of config_maps[name]."""
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    for name, src in config_maps.items():
        maps[name] = read_dir(src)
    pods = []
    for sts in (d for d in docs if d["kind"] == "StatefulSet"):
        spec = sts["spec"]
        sts_name = sts["metadata"]["name"]
        if spec["serviceName"] not in services:
            raise RuntimeError("%s names Service %s, which the manifests lack"
                               % (sts_name, spec["serviceName"]))
        template = spec["template"]["spec"]
        (container,) = template["containers"]
        # What this kubelet does not do is refused, not ignored.
        for key in ("initContainers", "hostNetwork", "securityContext"):
            if key in template:
                raise RuntimeError("%s: pod spec %s is not simulated" % (sts_name, key))
        for key in ("command", "envFrom", "workingDir", "lifecycle", "startupProbe"):
            if key in container:
                raise RuntimeError("%s: container %s is not simulated" % (sts_name, key))
        for m in container.get("volumeMounts", []):
            if "subPath" in m:
                raise RuntimeError("volume mount %s: subPath is not simulated" % m["name"])
        volumes = {}
        for v in template.get("volumes", []):
            if "items" in v.get("secret", v.get("configMap", {})):
                raise RuntimeError("volume %s: items are not simulated" % v["name"])
            if "persistentVolumeClaim" in v:
                claim = v["persistentVolumeClaim"]["claimName"]
                if claim not in claims:
                    raise RuntimeError("volume %s: no PersistentVolumeClaim %s" % (v["name"], claim))
                volumes[v["name"]] = data
            elif "configMap" in v:
                name = v["configMap"]["name"]
                if name not in maps:
                    raise RuntimeError("volume %s: no ConfigMap %s" % (v["name"], name))
                volumes[v["name"]] = volume_dir(work, "configmap", name, maps[name],
                                                v["configMap"].get("defaultMode", 0o644))
            elif "secret" in v:
                name = v["secret"]["secretName"]
                if name in secrets:
                    files = read_dir(secrets[name])
                elif v["secret"].get("optional"):
                    files = {}
                else:
                    raise RuntimeError("volume %s: no Secret %s" % (v["name"], name))
                volumes[v["name"]] = volume_dir(work, "secret", name, files,
                                                v["secret"].get("defaultMode", 0o644))
            else:
                raise RuntimeError("volume %s: kind not simulated" % v["name"])
        for i in range(spec["replicas"]):
            pods.append(Pod("%s-%d" % (sts_name, i), spec["serviceName"],
                            container, volumes))
    return pods


class Cluster:
    def __init__(self, podman, network, pods):
        self.podman = podman
        self.network = network
        self.pods = pods
        self.started = time.time()

    def since(self):
        return time.time() - self.started

    def start(self, pod, restart=False):
        pod.address = None
        if restart:  # the same container again (Kubernetes would make a new one)
            self.podman.run("start", pod.name)
            return
        args = ["run", "-d", "--name", pod.name, "--hostname", pod.name,
                "--network", self.network, "--network-alias", "%s.%s" % (pod.name, pod.service)]
        for e in pod.env():
            args += ["--env", e]
        for m in pod.container.get("volumeMounts", []):
            args += ["-v", "%s:%s%s" % (pod.volumes[m["name"]], m["mountPath"],
                                        ":ro" if m.get("readOnly") else "")]
        self.podman.run(*args, IMAGE, *pod.container.get("args", []))

    def address(self, pod):
        if pod.address is None:
            pod.address = self.podman.run(
                "inspect", pod.name, "--format",
                "{{(index .NetworkSettings.Networks \"%s\").IPAddress}}" % self.network).strip()
        return pod.address

    def probe(self, pod, probe):
        # A probe the manifest got wrong (an unknown port name) fails the run
        # here, not every probe silently.
        get = probe["httpGet"]
        port = get["port"] if isinstance(get["port"], int) else pod.ports[get["port"]]
        scheme = get.get("scheme", "HTTP").lower()
        # A kubelet's HTTPS probe verifies no certificate and sends none.
        context = ssl._create_unverified_context() if scheme == "https" else None
        try:
            url = "%s://%s:%d%s" % (scheme, self.address(pod), port, get["path"])
            with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1),
                                        context=context) as r:
                return 200 <= r.status < 400
        except Exception:  # refused, 503, a timeout: the probe failed
            return False

    def states(self):
        """Every pod's (status, exit code), from one podman call."""
        out = {}
        for c in json.loads(self.podman.run("ps", "-a", "--format", "json") or "[]"):
            for name in c.get("Names") or []:
                out[name] = (c.get("State", ""), int(c.get("ExitCode", 0)))
        return out

    def logs(self, pod):
        r = subprocess.run(self.podman.argv("logs", pod.name), env=self.podman.env,
                           capture_output=True, text=True, timeout=60)
        return r.stdout + r.stderr

    def tick(self):
        """One kubelet round: restarts, liveness, readiness."""
        now = time.time()
        states = self.states()
        for pod in self.pods:
            status, code = states.get(pod.name, ("missing", -1))
            if status in ("exited", "stopped"):
                if pod.exited_at is None:
                    pod.exited_at = now
                    pod.ready_at = None
                    say("EXIT %s %d %.1f" % (pod.name, code, self.since()))
                elif now - pod.exited_at >= pod.backoff:  # restartPolicy: Always
                    pod.backoff = min(2 * pod.backoff, 300.0)
                    pod.exited_at = None
                    pod.probe_failures = 0
                    self.start(pod, restart=True)
                    say("RESTART %s %.1f" % (pod.name, self.since()))
                continue
            if status != "running":
                continue  # created, or being started
            live = pod.container.get("livenessProbe")
            if live and now - pod.last_liveness >= live.get("periodSeconds", 10):
                pod.last_liveness = now
                pod.probe_failures = 0 if self.probe(pod, live) else pod.probe_failures + 1
                if pod.probe_failures >= live.get("failureThreshold", 3):
                    say("LIVENESS-FAILED %s %.1f" % (pod.name, self.since()))
                    self.podman.run("kill", pod.name, check=False)
            ready = pod.container.get("readinessProbe")
            if ready and pod.ready_at is None and self.probe(pod, ready):
                pod.ready_at = now
                say("READY %s %.1f" % (pod.name, self.since()))


def cleanup(podman, network, work):
    """Removes every container, the network, the images, the storage and the
    run's copies of binaries, Secrets and ConfigMaps; each step whatever the
    others did."""
    def attempt(what, *args, timeout=60):
        try:
            return podman.run(*args, timeout=timeout, check=False)
        except Exception as e:  # a step that hangs must not keep the others from running
            print("cleanup: %s: %s" % (what, e), file=sys.stderr)
            return ""
    ids = attempt("listing containers", "ps", "-aq").split()
    if ids:
        attempt("removing containers", "rm", "-f", "-t", "0", *ids)
    attempt("removing the network", "network", "rm", "-f", network)
    attempt("removing images", "rmi", "-a", "-f")
    for d in (podman.root, podman.runroot, os.path.join(work, "context"),
              os.path.join(work, "volumes")):
        shutil.rmtree(d, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--work", required=True)
    for flag in ("--bin_dir", "--k8s_dir", "--data"):
        p.add_argument(flag)
    p.add_argument("--manifest", action="append",
                   help="default: the k8s_dir's storage.yaml and statefulsets.yaml")
    p.add_argument("--secret", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--configmap", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--timeout", type=float, default=300, help="for everything, the build too")
    p.add_argument("--kill_chief_after_checkpoint", action="store_true")
    p.add_argument("--image_cache", metavar="FILE",
                   help="the image as `podman save` writes it: loaded when FILE exists, "
                        "else written after the build (one FILE per set of binaries)")
    p.add_argument("--name", default="pstrain-test",
                   help="the pods' network (and the run's /tmp/NAME-run)")
    p.add_argument("--cleanup", action="store_true",
                   help="only remove what an earlier run in --work left, and exit")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    podman = Podman(a.work, a.name)
    network = a.name
    if a.cleanup:
        cleanup(podman, network, a.work)
        return 0
    for flag in ("bin_dir", "k8s_dir", "data"):
        if not getattr(a, flag):
            p.error("--%s is required" % flag)

    def stop(*_):
        raise SystemExit(1)
    signal.signal(signal.SIGTERM, stop)
    deadline = time.time() + a.timeout  # for everything: the image's build too
    try:
        build_image(podman, a.work, a.bin_dir, a.k8s_dir, deadline, a.image_cache)
        manifests = a.manifest or [os.path.join(a.k8s_dir, f)
                                   for f in ("storage.yaml", "statefulsets.yaml")]
        docs = [d for m in manifests for d in yaml.safe_load_all(open(m)) if d]
        pods = pods_of(a.work, docs, a.data, dict(x.split("=", 1) for x in a.secret),
                       dict(x.split("=", 1) for x in a.configmap))
        podman.run("network", "create", network)
        cluster = Cluster(podman, network, pods)
        for pod in pods:  # podManagementPolicy: Parallel
            cluster.start(pod)
        say("STARTED %s" % " ".join(pod.name for pod in pods))
        chief = next(pod for pod in pods if "PSTRAIN_JOB=chief" in pod.env())
        # The pointer file is written once a checkpoint is committed.
        committed = os.path.join(a.data, "output/checkpoints/checkpoint")
        killed = False
        while time.time() < deadline:
            # The manifests' header: delete the StatefulSets once the chief
            # logs this (before any pod that ended is restarted again).
            if "training finished" in cluster.logs(chief):
                say("FINISHED %.1f" % cluster.since())
                break
            cluster.tick()
            if a.kill_chief_after_checkpoint and not killed and os.path.exists(committed):
                try:
                    podman.run("kill", chief.name)  # SIGKILL: a node lost, not a clean exit
                    killed = True
                    say("KILLED %s %.1f" % (chief.name, cluster.since()))
                except RuntimeError as e:  # not running this moment: the next round
                    print("kill: %s" % e, file=sys.stderr)
            time.sleep(0.5)
        else:
            say("TIMEOUT after %.0f s" % a.timeout)
            for pod in pods:
                say("--- %s\n%s" % (pod.name, cluster.logs(pod)[-3000:]))
            return 1
        for pod in pods:
            with open(os.path.join(a.work, pod.name + ".log"), "w") as f:
                f.write(cluster.logs(pod))
        say("SUMMARY " + json.dumps(json.load(open(os.path.join(a.data, "output/summary.json")))))
        return 0
    finally:
        cleanup(podman, network, a.work)


if __name__ == "__main__":
    sys.exit(main())
