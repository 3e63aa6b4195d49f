#include "worker/c_api.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "worker/session.h"

// The worker binary's own flags (common/runtime/daemon.h declares them;
// each program defines them): a session is opened with the same ones.
ABSL_FLAG(std::string, cluster_spec, "", "cluster spec JSON file (else TF_CONFIG)");
ABSL_FLAG(std::string, job, "worker", "job name; must be worker");
ABSL_FLAG(int, task, 0, "task index within the worker job");
ABSL_FLAG(std::string, config, "", "training config (text-format TrainingConfig)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warn, error");

struct pstrain_session {
  std::unique_ptr<pstrain::WorkerSession> session;
};

namespace {

int Fail(const absl::Status& st, char** error) {
  if (st.ok()) return 0;
  if (error != nullptr) *error = ::strdup(std::string(st.message()).c_str());
  return static_cast<int>(st.code());
}

// Exceptions never cross into C (a bad_alloc becomes RESOURCE_EXHAUSTED,
// any other INTERNAL).
template <typename F>
int Guard(char** error, F f) {
  try {
    return Fail(f(), error);
  } catch (const std::bad_alloc& e) {
    return Fail(absl::ResourceExhaustedError(e.what()), error);
  } catch (const std::exception& e) {
    return Fail(absl::InternalError(e.what()), error);
  } catch (...) {
    return Fail(absl::InternalError("an exception of unknown type"), error);
  }
}

}  // namespace

extern "C" {

int pstrain_api_version(void) { return PSTRAIN_C_API_VERSION; }

pstrain_session* pstrain_open(int argc, const char* const* argv, int* code, char** error) {
  pstrain_session* out = nullptr;
  const int rc = Guard(error, [&]() -> absl::Status {
    if (argc < 0 || (argc > 0 && argv == nullptr)) return absl::InvalidArgumentError("no argv");
    std::vector<std::string> args;
    for (int i = 0; i < argc; ++i) {
      if (argv[i] == nullptr) return absl::InvalidArgumentError("a null flag");
      args.emplace_back(argv[i]);
    }
    auto opened = pstrain::WorkerSession::Open(args);
    if (!opened.ok()) return opened.status();
    out = new pstrain_session{std::move(*opened)};
    return absl::OkStatus();
  });
  if (code != nullptr) *code = rc;
  return out;
}

int pstrain_close(pstrain_session* s, char** error) {
  if (s == nullptr) return 0;
  const int rc = Guard(error, [&] { return s->session->Close(); });
  delete s;
  return rc;
}

void pstrain_abandon(pstrain_session* s) {
  try {
    delete s;
  } catch (...) {  // (a destructor's logging: nothing to tell the caller)
  }
}

void pstrain_free(void* p) { std::free(p); }

int pstrain_worker(const pstrain_session* s) { return s->session->worker(); }
int pstrain_num_workers(const pstrain_session* s) { return s->session->num_workers(); }
int pstrain_sync(const pstrain_session* s) { return s->session->sync() ? 1 : 0; }
int64_t pstrain_start_step(const pstrain_session* s) { return s->session->start_step(); }
int pstrain_start_cursor(const pstrain_session* s, int64_t* epoch, int64_t* position) {
  const auto c = s->session->start_cursor();
  if (!c.has_value()) return 0;
  *epoch = c->epoch;
  *position = c->position;
  return 1;
}
int64_t pstrain_local_steps(const pstrain_session* s) { return s->session->local_steps(); }
int pstrain_rollbacks(const pstrain_session* s) { return s->session->rollbacks(); }
int pstrain_batch_size(const pstrain_session* s) {
  return s->session->config().data().batch_size();
}
int64_t pstrain_max_steps(const pstrain_session* s) { return s->session->config().max_steps(); }
uint64_t pstrain_seed(const pstrain_session* s) { return s->session->config().seed(); }

int pstrain_num_variables(const pstrain_session* s) {
  return static_cast<int>(s->session->variables().size());
}
const char* pstrain_variable_name(const pstrain_session* s, int v) {
  const auto& vars = s->session->variables();
  return v >= 0 && v < static_cast<int>(vars.size()) ? vars[v].name.c_str() : nullptr;
}
int pstrain_variable_rank(const pstrain_session* s, int v) {
  const auto& vars = s->session->variables();
  return v >= 0 && v < static_cast<int>(vars.size()) ? static_cast<int>(vars[v].shape.size())
                                                     : -1;
}
int64_t pstrain_variable_dim(const pstrain_session* s, int v, int d) {
  const auto& vars = s->session->variables();
  if (v < 0 || v >= static_cast<int>(vars.size())) return -1;
  const auto& shape = vars[v].shape;
  return d >= 0 && d < static_cast<int>(shape.size()) ? shape[d] : -1;
}

int pstrain_pull(pstrain_session* s, float* const* dst, int n, int* finished, int64_t* step,
                 char** error) {
  return Guard(error, [&]() -> absl::Status {
    if (s == nullptr) return absl::InvalidArgumentError("no session (NULL)");
    if (n < 0 || (n > 0 && dst == nullptr)) return absl::InvalidArgumentError("no buffers");
    for (int v = 0; v < n; ++v) {
      if (dst[v] == nullptr) return absl::InvalidArgumentError("a null buffer");
    }
    bool done = false;
    absl::Status st = s->session->Pull(absl::MakeConstSpan(dst, n), &done, step);
    *finished = done ? 1 : 0;
    return st;
  });
}

int pstrain_push(pstrain_session* s, const float* const* src, int n, float loss, int64_t examples,
                 int64_t cursor_epoch, int64_t cursor_position, double compute_seconds, int* end,
                 char** error) {
  return Guard(error, [&]() -> absl::Status {
    if (s == nullptr) return absl::InvalidArgumentError("no session (NULL)");
    if (n < 0 || (n > 0 && src == nullptr)) return absl::InvalidArgumentError("no buffers");
    for (int v = 0; v < n; ++v) {
      if (src[v] == nullptr) return absl::InvalidArgumentError("a null buffer");
    }
    pstrain::WorkerSession::StepReport report;
    report.loss = loss;
    report.examples = examples;
    report.cursor = {cursor_epoch, cursor_position};
    report.compute_seconds = compute_seconds;
    bool over = false;
    absl::Status st = s->session->Push(absl::MakeConstSpan(src, n), report, &over);
    *end = over ? 1 : 0;
    return st;
  });
}

int pstrain_push_ready(pstrain_session* s, const int* vars, const float* const* src, int n,
                       char** error) {
  return Guard(error, [&]() -> absl::Status {
    if (s == nullptr) return absl::InvalidArgumentError("no session (NULL)");
    if (n < 0 || (n > 0 && (vars == nullptr || src == nullptr))) {
      return absl::InvalidArgumentError("no buffers");
    }
    return s->session->PushReady(absl::MakeConstSpan(vars, n), absl::MakeConstSpan(src, n));
  });
}

int pstrain_push_streams(const pstrain_session* s) {
  return s->session->streams_pushes() ? 1 : 0;
}

int pstrain_table_dim(const pstrain_session* s, const char* table, char** error) {
  if (s == nullptr) {
    Fail(absl::InvalidArgumentError("no session (NULL)"), error);
    return -1;
  }
  auto dim = s->session->TableDim(table == nullptr ? "" : table);
  if (!dim.ok()) {
    Fail(dim.status(), error);
    return -1;
  }
  return *dim;
}

int pstrain_pull_rows(pstrain_session* s, const char* table, const uint64_t* ids, int64_t n,
                      float* out, char** error) {
  return Guard(error, [&]() -> absl::Status {
    if (s == nullptr) return absl::InvalidArgumentError("no session (NULL)");
    if (table == nullptr || n < 0 || (n > 0 && (ids == nullptr || out == nullptr))) {
      return absl::InvalidArgumentError("no table, ids or output");
    }
    return s->session->PullRows(table, absl::MakeConstSpan(ids, n), out);
  });
}

int pstrain_push_rows(pstrain_session* s, const char* table, const uint64_t* ids, int64_t n,
                      const float* grads, char** error) {
  return Guard(error, [&]() -> absl::Status {
    if (s == nullptr) return absl::InvalidArgumentError("no session (NULL)");
    if (table == nullptr || n < 0 || (n > 0 && (ids == nullptr || grads == nullptr))) {
      return absl::InvalidArgumentError("no table, ids or gradients");
    }
    return s->session->PushRows(table, absl::MakeConstSpan(ids, n), grads);
  });
}

int pstrain_report_eval(pstrain_session* s, const char* const* names, const double* values, int n,
                        int64_t step, int64_t examples, char** error) {
  return Guard(error, [&]() -> absl::Status {
    if (s == nullptr) return absl::InvalidArgumentError("no session (NULL)");
    if (n <= 0 || names == nullptr || values == nullptr) {
      return absl::InvalidArgumentError("an evaluation of no metrics");
    }
    pstrain::WorkerEvaluation eval;
    eval.step = step;
    eval.examples = examples;
    for (int i = 0; i < n; ++i) {
      if (names[i] == nullptr) return absl::InvalidArgumentError("a null metric name");
      eval.metrics.emplace_back(names[i], values[i]);
    }
    return s->session->ReportEval(std::move(eval));
  });
}

}  // extern "C"
