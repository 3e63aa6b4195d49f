"""Validates pstrain's Kubernetes manifests (configs/k8s/*.yaml) for tests/k8s_test.

  validate.py K8S_DIR VERSION [--config FILE]
                                      validate every object (and that the ConfigMap holds
                                      FILE's text); print one
                                      "TF_CONFIG <statefulset> <ordinal> <json>" line per
                                      StatefulSet pod, built by the entry point as the pod would
  validate.py K8S_DIR VERSION --self-test
                                      damage each manifest in known ways and fail unless every
                                      damaged copy is refused (the check can fail)

Core objects are checked by kubernetes-validate against Kubernetes VERSION's
own schemas (strict: unknown fields are errors); the TFJob against
tfjob-v1.schema.json (the kubeflow.org/v1 CRD's fields), and each of its pod
templates as a core PodTemplate. Exit 0 when all is valid; else one line per
problem on stderr and exit 1.
"""
import copy
import glob
import json
import os
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml


def problems_of(doc, version, tfjob_schema):
    """The problems with one manifest object, as strings (none: valid)."""
    out = []
    if not isinstance(doc, dict):
        return ["not a mapping"]
    if doc.get("apiVersion") == "kubeflow.org/v1" and doc.get("kind") == "TFJob":
        validator = jsonschema.Draft7Validator(tfjob_schema)
        out += ["TFJob: %s at %s" % (e.message, "/".join(map(str, e.path)))
                for e in validator.iter_errors(doc)]
        specs = doc.get("spec", {}).get("tfReplicaSpecs", {})
        for name, replica in (specs.items() if isinstance(specs, dict) else []):
            template = replica.get("template") if isinstance(replica, dict) else None
            if not isinstance(template, dict):
                continue
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": "tfjob-" + name.lower()}, "template": template}
            try:
                kubernetes_validate.validate(pod_template, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                out.append("TFJob %s template: %s" % (name, e.message))
        return out
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        out.append("%s %s: %s at %s" % (doc.get("kind"), doc.get("metadata", {}).get("name"),
                                         e.message, "/".join(map(str, e.path))))
    except kubernetes_validate.SchemaNotFoundError as e:
        out.append("%s: no schema (%s)" % (doc.get("kind"), e))
    return out


def load(k8s_dir):
    docs = []
    for path in sorted(glob.glob(os.path.join(k8s_dir, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((os.path.basename(path), doc))
    return docs


def env_of(statefulset):
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def tf_configs(k8s_dir, docs):
    """What the entry point (k8s_dir/entrypoint.sh) builds in each StatefulSet
    pod, and cross-checks."""
    out, problems = [], []
    sets = {d["metadata"]["name"]: d for _, d in docs if d.get("kind") == "StatefulSet"}
    replicas = {env_of(s)["PSTRAIN_JOB"]: s["spec"]["replicas"] for s in sets.values()}
    for name, s in sorted(sets.items()):
        env = env_of(s)
        for key, job in (("PSTRAIN_NUM_PS", "ps"), ("PSTRAIN_NUM_WORKERS", "worker")):
            if int(env.get(key, "-1")) != replicas.get(job):
                problems.append("%s: %s=%s but the %s StatefulSet has %s replicas"
                                % (name, key, env.get(key), job, replicas.get(job)))
        service = env.get("PSTRAIN_SERVICE", "pstrain")
        if s["spec"].get("serviceName") != service:
            problems.append("%s: serviceName is not the headless Service %s" % (name, service))
        if name != "%s-%s" % (env.get("PSTRAIN_PREFIX", "pstrain"), env["PSTRAIN_JOB"]):
            problems.append("%s: not named <PSTRAIN_PREFIX>-<PSTRAIN_JOB>" % name)
        for ordinal in range(s["spec"]["replicas"]):
            run_env = dict(os.environ, PSTRAIN_POD_NAME="%s-%d" % (name, ordinal), **env)
            run_env.pop("TF_CONFIG", None)
            r = subprocess.run(["/bin/sh", os.path.join(k8s_dir, "entrypoint.sh"),
                                "--print-tf-config"], env=run_env, capture_output=True,
                               text=True, timeout=30)
            if r.returncode != 0:
                problems.append("%s-%d: entrypoint.sh: %s" % (name, ordinal, r.stderr.strip()))
                continue
            out.append("TF_CONFIG %s %d %s" % (name, ordinal, r.stdout.strip()))
    return out, problems


def damaged_copies(docs):
    """(what, docs) pairs, each with one known defect."""
    for i, (file, doc) in enumerate(docs):
        kind = doc.get("kind")
        d = copy.deepcopy(doc)
        (d["spec"] if "spec" in d else d)["unknownField"] = 1
        yield ("%s %s: an unknown field" % (file, kind), d)
        if kind == "TFJob":
            d = copy.deepcopy(doc)
            d["spec"]["tfReplicaSpecs"]["PS"]["replicas"] = "two"
            yield ("TFJob: replicas not an integer", d)
            d = copy.deepcopy(doc)
            d["spec"]["tfReplicaSpecs"]["Sidecar"] = d["spec"]["tfReplicaSpecs"]["PS"]
            yield ("TFJob: an unknown replica type", d)
            d = copy.deepcopy(doc)
            d["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["ports"][0][
                "containerPort"] = "2222"
            yield ("TFJob: a container port not an integer", d)
            d = copy.deepcopy(doc)
            d["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0][
                "livenessProbe"]["httpGet"]["pathh"] = "/healthz"
            yield ("TFJob: a misspelt probe field", d)
        if kind == "StatefulSet":
            d = copy.deepcopy(doc)
            d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = [4]
            yield ("StatefulSet: a memory limit that is a list", d)
            d = copy.deepcopy(doc)
            del d["spec"]["selector"]
            yield ("StatefulSet: no selector", d)


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    k8s_dir, version = sys.argv[1], sys.argv[2]
    with open(os.path.join(k8s_dir, "tfjob-v1.schema.json")) as f:
        tfjob_schema = json.load(f)
    docs = load(k8s_dir)
    if not docs:
        print("no manifests in " + k8s_dir, file=sys.stderr)
        return 1
    if "--self-test" in sys.argv[3:]:
        missed = 0
        count = 0
        for what, doc in damaged_copies(docs):
            count += 1
            if not problems_of(doc, version, tfjob_schema):
                print("damaged manifest accepted: " + what, file=sys.stderr)
                missed += 1
        print("self-test: %d damaged manifests, %d refused" % (count, count - missed))
        return 1 if missed else 0
    problems = []
    kinds = []
    for file, doc in docs:
        kinds.append("%s/%s" % (doc.get("kind"), doc.get("metadata", {}).get("name")))
        problems += ["%s: %s" % (file, p) for p in problems_of(doc, version, tfjob_schema)]
    lines, cross = tf_configs(k8s_dir, docs)
    problems += cross
    # --config FILE: the ConfigMap must carry that file's text unchanged.
    if "--config" in sys.argv:
        with open(sys.argv[sys.argv.index("--config") + 1]) as f:
            want = f.read().rstrip("\n") + "\n"
        maps = [d for _, d in docs if d.get("kind") == "ConfigMap"]
        if len(maps) != 1 or maps[0].get("data", {}).get("train.pbtxt") != want:
            problems.append("the ConfigMap does not carry the config unchanged")
    for p in problems:
        print(p, file=sys.stderr)
    print("validated against Kubernetes %s: %s" % (version, " ".join(kinds)))
    for line in lines:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
