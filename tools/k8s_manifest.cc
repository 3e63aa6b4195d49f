#include "tools/k8s_manifest.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace pstrain {

bool IsDnsLabel(const std::string& s, size_t max) {
  if (s.empty() || s.size() > max || s.front() == '-' || s.back() == '-') return false;
  for (char c : s) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) return false;
  }
  return true;
}

namespace {

// A whole number with an optional binary or decimal suffix: 20Gi, 500M.
bool IsQuantity(const std::string& s) {
  size_t digits = 0;
  while (digits < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0 || digits > 12) return false;
  const std::string suffix = s.substr(digits);
  for (const char* ok : {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E"}) {
    if (suffix == ok) return true;
  }
  return false;
}

struct Role {
  std::string job;       // chief, ps, worker
  std::string replica;   // the TFJob replica type
  int replicas;
  std::string requests;  // {cpu: ..., memory: ...}
  std::string limits;
  bool data_read_only;
};

// One container spec, indented for its place under `containers:`.
std::string Container(const K8sManifestOptions& o, const Role& r, bool tfjob,
                      const std::string& indent) {
  const std::string port = tfjob ? "{name: tfjob-port, containerPort: 2222}"
                                 : "{name: rpc, containerPort: 7000}";
  std::string env = absl::StrCat(indent, "  env:\n", indent, "    - {name: PSTRAIN_JOB, value: ",
                                 r.job, "}\n");
  if (!tfjob) {
    absl::StrAppend(&env, indent, "    - {name: PSTRAIN_PREFIX, value: ", o.name, "}\n", indent,
                    "    - {name: PSTRAIN_SERVICE, value: ", o.name, "}\n", indent,
                    "    - {name: PSTRAIN_NUM_PS, value: \"", o.num_ps, "\"}\n", indent,
                    "    - {name: PSTRAIN_NUM_WORKERS, value: \"", o.num_workers, "\"}\n");
  }
  absl::StrAppend(&env, indent,
                  "    - {name: PSTRAIN_SECRET_FILE, value: /var/run/pstrain/auth/cluster.secret}\n");
  if (o.tls) {
    absl::StrAppend(&env, indent, "    - {name: PSTRAIN_TLS_DIR, value: /var/run/pstrain/tls}\n",
                    indent, "    - {name: PSTRAIN_TLS_CRL_DIR, value: /var/run/pstrain/crl}\n");
  }
  // Kubernetes' HTTPS probes neither check the certificate nor show one:
  // the daemons answer /healthz and /readyz without a client certificate.
  const std::string probe_scheme = o.tls ? ", scheme: HTTPS" : "";
  if (r.job == "chief") {
    absl::StrAppend(&env, indent, "    - {name: PSTRAIN_RESUME, value: \"1\"}\n");
  }
  return absl::StrCat(
      indent, "- name: ", tfjob ? "tensorflow" : "pstrain", "\n",  //
      indent, "  image: ", o.image, "\n",                          //
      env,                                                         //
      indent, "  ports:\n",                                        //
      indent, "    - ", port, "\n",                                //
      indent, "    - {name: metrics, containerPort: 9090}\n",      //
      indent, "  resources:\n",                                    //
      indent, "    requests: ", r.requests, "\n",                  //
      indent, "    limits: ", r.limits, "\n",                      //
      indent, "  livenessProbe:\n",                                //
      indent, "    httpGet: {path: /healthz, port: metrics", probe_scheme, "}\n",  //
      indent, "    periodSeconds: 10\n",                           //
      indent, "  readinessProbe:\n",                               //
      indent, "    httpGet: {path: /readyz, port: metrics", probe_scheme, "}\n",  //
      indent, "    periodSeconds: 5\n",                            //
      indent, "  volumeMounts:\n",                                 //
      indent, "    - {name: data, mountPath: /data, readOnly: ", r.data_read_only ? "true" : "false",
      "}\n",                                                                      //
      indent, "    - {name: config, mountPath: /etc/pstrain, readOnly: true}\n",  //
      indent, "    - {name: auth, mountPath: /var/run/pstrain/auth, readOnly: true}\n",
      o.tls ? absl::StrCat(indent,
                           "    - {name: tls, mountPath: /var/run/pstrain/tls, readOnly: true}\n",
                           indent,
                           "    - {name: crl, mountPath: /var/run/pstrain/crl, readOnly: true}\n")
            : "");
}

// The pod volumes of role `job`: with TLS, the Secret of that role's
// certificates and keys only (<name>-tls-<job>), and the revocation lists'
// Secret (<name>-tls-crl, optional: there is none until one is revoked).
std::string DataClaim(const K8sManifestOptions& o) {
  return o.data_claim.empty() ? o.name + "-data" : o.data_claim;
}
std::string AuthSecret(const K8sManifestOptions& o) {
  return o.auth_secret.empty() ? o.name + "-auth" : o.auth_secret;
}

std::string Volumes(const K8sManifestOptions& o, const std::string& job,
                    const std::string& indent) {
  return absl::StrCat(indent, "- name: data\n", indent, "  persistentVolumeClaim: {claimName: ",
                      DataClaim(o), "}\n", indent, "- name: config\n", indent,
                      "  configMap: {name: ", o.name, "-config}\n", indent, "- name: auth\n",
                      indent, "  secret: {secretName: ", AuthSecret(o), ", defaultMode: 0400}\n",
                      o.tls ? absl::StrCat(indent, "- name: tls\n", indent,
                                           "  secret: {secretName: ", o.name, "-tls-", job,
                                           ", defaultMode: 0400}\n", indent, "- name: crl\n",
                                           indent, "  secret: {secretName: ", o.name,
                                           "-tls-crl, optional: true}\n")
                            : "");
}

}  // namespace

std::string K8sDataClaim(const std::string& name, const std::string& storage) {
  return absl::StrCat("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: ", name,
                      "-data\n  labels:\n    app.kubernetes.io/name: ", name,
                      "\nspec:\n  accessModes: [ReadWriteMany]\n  resources:\n    requests:\n"
                      "      storage: ", storage, "\n");
}

absl::StatusOr<std::string> RenderK8sManifest(const K8sManifestOptions& o) {
  // Pod names are <name>-worker-<i>: they must stay DNS labels (63).
  if (!IsDnsLabel(o.name, 40)) {
    return absl::InvalidArgumentError(
        "--name: expected a DNS label of at most 40 characters (a-z, 0-9, '-')");
  }
  if (o.image.empty() || o.image.size() > 512 ||
      o.image.find_first_of(" \t\r\n\"'#{}[],&*!|>%@`\\") != std::string::npos) {
    return absl::InvalidArgumentError("--image: expected an image reference such as "
                                      "registry.example.com/pstrain:1.0");
  }
  if (o.kind != "statefulsets" && o.kind != "tfjob") {
    return absl::InvalidArgumentError("--kind: expected statefulsets or tfjob");
  }
  if (o.num_ps < 1 || o.num_ps > 1000) return absl::InvalidArgumentError("--ps: expected 1..1000");
  if (o.num_workers < 1 || o.num_workers > 10000) {
    return absl::InvalidArgumentError("--workers: expected 1..10000");
  }
  if (o.gpus_per_worker < 0 || o.gpus_per_worker > 16) {
    return absl::InvalidArgumentError("--gpus_per_worker: expected 0..16");
  }
  for (const std::string* shared : {&o.data_claim, &o.auth_secret}) {
    if (!shared->empty() && !IsDnsLabel(*shared, 63)) {
      return absl::InvalidArgumentError("a shared claim or Secret name must be a DNS label");
    }
  }
  if (!IsQuantity(o.storage)) {
    return absl::InvalidArgumentError("--storage: expected a size such as 20Gi");
  }
  for (char c : o.config_text) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') {
      return absl::InvalidArgumentError("the config holds control characters");
    }
  }
  const bool tfjob = o.kind == "tfjob";
  const std::string worker_limits =
      o.gpus_per_worker > 0
          ? absl::StrCat("{memory: 4Gi, nvidia.com/gpu: ", o.gpus_per_worker, "}")
          : std::string("{memory: 4Gi}");
  const Role roles[] = {
      {"chief", "Chief", 1, "{cpu: \"1\", memory: 2Gi}", "{memory: 4Gi}", false},
      {"ps", "PS", o.num_ps, "{cpu: \"2\", memory: 4Gi}", "{memory: 8Gi}", false},
      {"worker", "Worker", o.num_workers, "{cpu: \"2\", memory: 2Gi}", worker_limits, true},
  };

  std::string out = absl::StrCat(
      "# pstrain on Kubernetes (", tfjob ? "a Kubeflow TFJob" : "a headless Service and StatefulSets",
      "), from `pstrain k8s-manifest`: 1 chief, ", o.num_ps, " ps, ", o.num_workers,
      " workers. First:\n"
      "#   pstrain tokens --out=auth\n"
      "#   kubectl create secret generic ", AuthSecret(o),
      " --from-file=cluster.secret=auth/cluster.secret\n"
      "# Size each server's memory from `pstrain plan`. configs/k8s documents every object.\n");
  if (o.tls) {
    absl::StrAppend(
        &out,
        "# Mutual TLS: certificates named by task (pods' hosts are known only at start), the\n"
        "# CA's key kept off the cluster, one Secret per role (a pod reads its own role's keys\n"
        "# only: a worker's cannot pass for a server or the chief):\n"
        "#   pstrain certs --ps=", o.num_ps, " --workers=", o.num_workers,
        " --out=tls && mv tls/ca.key ca.key.keep\n"
        "#   for job in chief ps worker; do kubectl create secret generic ", o.name,
        "-tls-$job \\\n"
        "#     --from-file=tls/ca.crt $(printf -- ' --from-file=%s' tls/$job-*.crt tls/$job-*.key); done\n"
        "# Renewing is pstrain certs ... again (with ca.key back) and the Secrets updated\n"
        "#   (kubectl create ... --dry-run=client -o yaml | kubectl apply -f -): the daemons\n"
        "#   take the new files without a restart (--tls_reload_s).\n"
        "# Revoking (with ca.key back) writes tls/crl/; its Secret, mounted in every pod, is read\n"
        "#   at each handshake once kubelet has updated it (within a minute or so):\n"
        "#   pstrain certs --out=tls --revoke=worker:3 && kubectl create secret generic ", o.name,
        "-tls-crl \\\n"
        "#     --from-file=tls/crl/ --dry-run=client -o yaml | kubectl apply -f -\n"
        "# Prometheus scrapes with monitor.crt and .key, tls_config server_name metrics.pstrain.\n");
  }
  // The config, verbatim, as a block scalar.
  absl::StrAppend(&out, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ", o.name,
                  "-config\n  labels:\n    app.kubernetes.io/name: ", o.name,
                  // |2: the indentation is stated, so a config whose first line
                  // starts with spaces keeps them.
                  "\ndata:\n  train.pbtxt: |2\n");
  for (absl::string_view line : absl::StrSplit(o.config_text, '\n')) {
    absl::StrAppend(&out, "    ", line, "\n");
  }
  if (o.data_claim.empty()) absl::StrAppend(&out, "---\n", K8sDataClaim(o.name, o.storage));
  if (tfjob) {
    absl::StrAppend(&out, "---\napiVersion: kubeflow.org/v1\nkind: TFJob\nmetadata:\n  name: ",
                    o.name, "\n  labels:\n    app.kubernetes.io/name: ", o.name,
                    "\nspec:\n  runPolicy:\n    cleanPodPolicy: Running\n    backoffLimit: 3\n"
                    "  tfReplicaSpecs:\n");
    for (const Role& r : roles) {
      absl::StrAppend(&out, "    ", r.replica, ":\n      replicas: ", r.replicas,
                      "\n      restartPolicy: OnFailure\n      template:\n        spec:\n"
                      "          containers:\n",
                      Container(o, r, true, "            "), "          volumes:\n",
                      Volumes(o, r.job, "            "));
    }
    return out;
  }
  absl::StrAppend(&out, "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: ", o.name,
                  "\n  labels:\n    app.kubernetes.io/name: ", o.name,
                  "\nspec:\n  clusterIP: None\n  publishNotReadyAddresses: true\n  selector:\n"
                  "    app.kubernetes.io/name: ", o.name,
                  "\n  ports:\n    - {name: rpc, port: 7000}\n    - {name: metrics, port: 9090}\n");
  for (const Role& r : roles) {
    const std::string labels = absl::StrCat("app.kubernetes.io/name: ", o.name,
                                            "\n      app.kubernetes.io/component: ", r.job);
    absl::StrAppend(
        &out, "---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: ", o.name, "-",
        r.job, "\n  labels:\n    app.kubernetes.io/name: ", o.name,
        "\n    app.kubernetes.io/component: ", r.job, "\nspec:\n  serviceName: ", o.name,
        "\n  replicas: ", r.replicas, "\n  podManagementPolicy: Parallel\n  selector:\n"
        "    matchLabels:\n      ", labels, "\n  template:\n    metadata:\n      labels:\n"
        "        ", absl::StrReplaceAll(labels, {{"\n      ", "\n        "}}),
        "\n    spec:\n      containers:\n", Container(o, r, false, "        "),
        "      volumes:\n", Volumes(o, r.job, "        "));
  }
  return out;
}

}  // namespace pstrain
