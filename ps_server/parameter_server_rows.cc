// ParameterServer's embedding rows: admission of row requests; the lookups,
// staging and applies themselves are the row store's (row_store.h). The
// class's contract and locking are in parameter_server.h.

#include "ps_server/parameter_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/status_macros.h"

namespace pstrain {

absl::Status ParameterServer::CheckRowsRequestLocked(uint64_t incarnation, int worker,
                                                     const std::string& table,
                                                     Model::Table** out) const {
  RETURN_IF_ERROR(CheckIncarnationLocked(incarnation));
  if (worker < -1 || worker >= model_->num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker, " out of range; expected -1..", model_->num_workers - 1));
  }
  auto it = model_->tables.find(table);
  if (it == model_->tables.end()) {
    return absl::NotFoundError(absl::StrCat("no embedding table \"", table, "\""));
  }
  *out = it->second.get();
  return absl::OkStatus();
}

uint64_t ParameterServer::StartPullRows(const PullRowsRequest& request, PullRowsCallback done) {
  auto ids = std::make_shared<std::vector<uint64_t>>();
  absl::Status st = RowStore::DecodeIds(request.ids(), ids.get());
  std::vector<Completion> completions;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    Model::Table* table = nullptr;
    if (st.ok()) st = CheckRowsRequestLocked(request.incarnation(), request.worker(),
                                             request.table(), &table);
    if (st.ok() && request.timeout_ms() < 0) {
      st = absl::InvalidArgumentError("PullRows: negative timeout_ms");
    }
    if (st.ok() &&
        static_cast<int64_t>(ids->size()) * table->rows->dim() * 4 > RowStore::kMaxRowsBytes) {
      st = absl::InvalidArgumentError(absl::StrCat(
          "PullRows: ", ids->size(), " rows of ", table->rows->dim(), " floats exceed ",
          RowStore::kMaxRowsBytes, " bytes; pull them in parts"));
    }
    if (st.ok()) {
      // Rows follow the dense pull, which already waited for the version,
      // so this rarely waits; when it does, it is parked as a pull is. The
      // rows are looked up once the version is there, outside mu_ (the
      // model reference keeps the table alive through a re-initialisation),
      // on the thread that made it ready (a push completing the step).
      PullRequest wait;
      wait.set_incarnation(request.incarnation());
      wait.set_worker(request.worker());
      wait.set_min_version(request.min_version());
      wait.set_timeout_ms(request.timeout_ms());
      // The chief's lookups (its evaluation) change nothing: when they
      // come must not change what training does.
      const bool peek = request.worker() < 0;
      PullCallback lookup = [this, model = model_, table, ids, peek, done = std::move(done)](
                                absl::Status status, PullReply reply) {
        PulledRows rows;
        if (status.ok()) {
          absl::StatusOr<PulledRows> found = rows_.Lookup(*table, *ids, reply.version, peek);
          status = found.status();
          if (found.ok()) rows = *std::move(found);
        }
        if (status.ok()) {
          absl::MutexLock lock(&mu_);
          ++counters_.pulls;
          counters_.pull_payload_bytes += rows.floats * 4;
          counters_.pull_copied_bytes += rows.floats * 4;
        }
        done(std::move(status), std::move(rows));
      };
      id = ServeOrParkLocked(wait, std::move(lookup), /*rows=*/true, &completions);
    }
  }
  if (!st.ok()) {
    done(std::move(st), {});  // refused: `done` was not handed on
    return 0;
  }
  RunCompletions(&completions);
  return id;
}

absl::Status ParameterServer::PullRows(const PullRowsRequest& request,
                                       PullRowsResponse* response) {
  absl::Notification done;
  absl::Status status;
  PulledRows rows;
  const uint64_t id = StartPullRows(request, [&](absl::Status st, PulledRows r) {
    status = std::move(st);
    rows = std::move(r);
    done.Notify();
  });
  AwaitParked(id, request.timeout_ms(), &done);
  if (!status.ok()) return status;
  response->set_version(rows.version);
  response->set_dim(rows.dim);
  response->set_rows(reinterpret_cast<const char*>(rows.values->data()),
                     static_cast<size_t>(rows.floats) * sizeof(float));
  return absl::OkStatus();
}

absl::Status ParameterServer::PushRows(const PushRowsRequest& request,
                                       PushRowsResponse* response) {
  if (request.ids().size() % 8 != 0) {
    absl::MutexLock lock(&mu_);
    RejectLocked(Rejection::kMalformed);
    return absl::InvalidArgumentError(absl::StrCat(
        "PushRows: ", request.ids().size(), " bytes of ids is not a whole number of uint64"));
  }
  PushRowsRequest header;
  header.set_incarnation(request.incarnation());
  header.set_worker(request.worker());
  header.set_step(request.step());
  header.set_table(request.table());
  header.set_session(request.session());
  header.set_num_ids(static_cast<int64_t>(request.ids().size() / 8));
  SegmentedBytes payload(request.ids());
  payload.Append(request.gradients());
  return PushRows(header, payload, response);
}

absl::Status ParameterServer::PushRows(const PushRowsRequest& request,
                                       const SegmentedBytes& payload,
                                       PushRowsResponse* response) {
  std::vector<uint64_t> ids;
  std::vector<float> grads;
  bool oversize = false;
  absl::Status st = RowStore::DecodePushIds(request, payload, &ids, &oversize);
  const Rejection refused = oversize ? Rejection::kSize : Rejection::kMalformed;
  const int64_t grad_bytes = payload.size() - static_cast<int64_t>(ids.size()) * 8;
  std::shared_ptr<Model> model;
  Model::Table* table = nullptr;
  auto reject = [this](absl::Status status, Rejection reason) {
    absl::MutexLock lock(&mu_);
    if (!absl::IsUnavailable(status)) RejectLocked(reason);
    return status;
  };
  // The table's checks of ids and values: OUT_OF_RANGE for an id outside a
  // fixed-size table, INVALID_ARGUMENT for NaN or Inf.
  auto values_reason = [](const absl::Status& status) {
    return absl::IsOutOfRange(status) ? Rejection::kOutOfRange : Rejection::kNonFinite;
  };
  if (!st.ok()) return reject(st, refused);
  {
    absl::MutexLock lock(&mu_);
    st = CheckRowsRequestLocked(request.incarnation(), request.worker(), request.table(), &table);
    if (st.ok() && request.worker() < 0) st = absl::InvalidArgumentError("PushRows: no worker");
    if (st.ok() && request.step() < 0) {
      RejectLocked(Rejection::kMalformed);
      return absl::InvalidArgumentError(absl::StrCat("PushRows: negative step ", request.step()));
    }
    if (!st.ok()) {
      // CheckRowsRequestLocked: FAILED_PRECONDITION (incarnation), NOT_FOUND
      // (no such table), INVALID_ARGUMENT (the worker).
      if (!absl::IsUnavailable(st)) {
        RejectLocked(absl::IsFailedPrecondition(st) ? Rejection::kIncarnation
                     : absl::IsNotFound(st)         ? Rejection::kShape
                                                    : Rejection::kWorker);
      }
      return st;
    }
    model = model_;
  }
  if (absl::Status bad = RowStore::DecodePushGradients(request, payload, *table, ids, &grads);
      !bad.ok()) {
    return reject(bad, Rejection::kShape);
  }
  // Sync stages the rows for later, so they are checked now; async's apply
  // checks them itself, changing nothing when they are refused.
  if (model->sync) {
    if (absl::Status bad = table->rows->CheckGradients(ids, grads.data()); !bad.ok()) {
      return reject(bad, values_reason(bad));
    }
  }
  const int w = request.worker();
  float learning_rate = 0;
  int64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AwaitPushesReleasedLocked(model, "PushRows"));
    RETURN_IF_ERROR(AdmitSessionLocked(w, request.session(), "PushRows"));
    if (request.step() > version_) {
      RejectLocked(Rejection::kAhead);
      return absl::FailedPreconditionError(absl::StrCat(
          "PushRows: step ", request.step(), " is ahead of this server's version ", version_));
    }
    response->set_version(version_);
    if (FinishedLocked()) {
      response->set_outcome(FINISHED);
      return absl::OkStatus();
    }
    counters_.push_payload_bytes += grad_bytes;
    counters_.push_copied_bytes += grad_bytes;
    if (model->sync) {
      if (!sync_.failure().ok()) return sync_.failure();
      if (request.step() < version_) {
        ++counters_.gradients_dropped_stale;
        response->set_outcome(DROPPED_STALE);
        return absl::OkStatus();
      }
      if (absl::Status full = RowStore::Stage(table, w, version_, ids, grads); !full.ok()) {
        RejectLocked(Rejection::kSize);
        return full;
      }
      response->set_outcome(ACCUMULATED);
      return absl::OkStatus();
    }
    version = version_;
    learning_rate = table->learning_rate.At(version_);
    if (model->staleness_scaled_lr && version_ - request.step() > 1) {
      learning_rate /= static_cast<float>(version_ - request.step());
    }
    ++rows_in_flight_;
  }
  st = RowStore::ApplyNow(table, ids, grads, learning_rate, version);
  {
    absl::MutexLock lock(&mu_);
    if (model_ == model) --rows_in_flight_;
  }
  if (!st.ok()) return reject(st, values_reason(st));
  response->set_outcome(APPLIED);
  return absl::OkStatus();
}

absl::Status ParameterServer::LoadRows(const LoadRowsRequest& request,
                                       LoadRowsResponse* response) {
  std::vector<uint64_t> ids;
  RETURN_IF_ERROR(RowStore::DecodeIds(request.ids(), &ids));
  Model::Table* table = nullptr;
  std::shared_ptr<Model> model;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckRowsRequestLocked(request.incarnation(), -1, request.table(), &table));
    model = model_;
  }
  ASSIGN_OR_RETURN(const int64_t rows, RowStore::Load(*model, table, ids, request));
  absl::MutexLock lock(&mu_);
  if (model_ != model) return ReinitializedError();
  response->set_rows(rows);
  return absl::OkStatus();
}
}  // namespace pstrain
