#include "ps_server/row_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/embedding_ids.h"
#include "common/base/status_macros.h"

namespace pstrain {

absl::Status RowStore::DecodeIds(const std::string& bytes, std::vector<uint64_t>* ids) {
  if (bytes.size() % 8 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ids: ", bytes.size(), " bytes is not a whole number of uint64"));
  }
  if (bytes.size() / 8 > kMaxRowsPerRequest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids: ", bytes.size() / 8, " ids in one request; at most ", kMaxRowsPerRequest));
  }
  ids->resize(bytes.size() / 8);
  // memcpy from or to null is undefined even for 0 bytes (an empty vector's
  // data() may be null): found by tests/fuzz/ps_request_fuzzer under UBSan.
  if (!bytes.empty()) std::memcpy(ids->data(), bytes.data(), bytes.size());  // little-endian hosts
  return absl::OkStatus();
}

absl::Status RowStore::DecodePushIds(const PushRowsRequest& request, const SegmentedBytes& payload,
                                     std::vector<uint64_t>* ids, bool* oversize) {
  *oversize = false;
  if (request.num_ids() < 0 || !request.ids().empty() || !request.gradients().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushRows: ", request.num_ids(), " ids, or ids and gradients in the header"));
  }
  if (static_cast<uint64_t>(request.num_ids()) > kMaxRowsPerRequest) {
    *oversize = true;
    return absl::InvalidArgumentError(absl::StrCat(
        "PushRows: ", request.num_ids(), " ids in one request; at most ", kMaxRowsPerRequest));
  }
  if (payload.size() < request.num_ids() * 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PushRows: ", payload.size(), " bytes of payload for ", request.num_ids(), " ids"));
  }
  ids->resize(static_cast<size_t>(request.num_ids()));
  if (!ids->empty()) payload.CopyTo(0, request.num_ids() * 8, ids->data());  // little-endian hosts
  return absl::OkStatus();
}

absl::Status RowStore::DecodePushGradients(const PushRowsRequest& request,
                                           const SegmentedBytes& payload,
                                           const ServerModel::Table& table,
                                           const std::vector<uint64_t>& ids,
                                           std::vector<float>* grads) {
  const int dim = table.rows->dim();
  const int64_t grad_bytes = payload.size() - static_cast<int64_t>(ids.size()) * 8;
  if (grad_bytes != static_cast<int64_t>(ids.size() * dim * sizeof(float))) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushRows: ", grad_bytes, " bytes of gradients for ", ids.size(),
                     " ids of table ", request.table(), " (", dim, " floats each)"));
  }
  grads->resize(ids.size() * dim);
  if (!grads->empty()) {
    payload.CopyTo(static_cast<int64_t>(ids.size()) * 8, grad_bytes, grads->data());
  }
  return absl::OkStatus();
}

std::shared_ptr<std::vector<float>> RowStore::BufferPool::Take(int64_t floats) {
  std::unique_ptr<std::vector<float>> buffer;
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      buffer = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (buffer == nullptr) buffer = std::make_unique<std::vector<float>>();
  // Pulls of one batch size reuse a buffer as it is (a larger one grows it once).
  buffer->resize(static_cast<size_t>(floats));
  std::weak_ptr<BufferPool> pool = weak_from_this();
  return std::shared_ptr<std::vector<float>>(buffer.release(), [pool](std::vector<float>* b) {
    std::unique_ptr<std::vector<float>> owned(b);
    if (std::shared_ptr<BufferPool> p = pool.lock()) {
      absl::MutexLock lock(&p->mu_);
      if (p->free_.size() < kKeep) p->free_.push_back(std::move(owned));
    }
  });
}

absl::StatusOr<PulledRows> RowStore::Lookup(const ServerModel::Table& table,
                                            const std::vector<uint64_t>& ids, int64_t version,
                                            bool peek) {
  PulledRows rows;
  rows.version = version;
  rows.dim = table.rows->dim();
  rows.floats = static_cast<int64_t>(ids.size()) * rows.dim;
  rows.values = buffers_->Take(rows.floats);
  RETURN_IF_ERROR(peek ? table.rows->Peek(ids, rows.values->data())
                       : table.rows->Lookup(ids, version, rows.values->data()));
  return rows;
}

absl::Status RowStore::Stage(ServerModel::Table* table, int w, int64_t step,
                             const std::vector<uint64_t>& ids, const std::vector<float>& grads) {
  std::vector<uint64_t>& staged_ids = table->staged_ids[w];
  std::vector<float>& staged_grads = table->staged_grads[w];
  // A step's rows from one worker are bounded like one request's.
  if (staged_ids.size() + ids.size() > kMaxRowsPerRequest) {
    return absl::ResourceExhaustedError(
        absl::StrCat("PushRows: worker ", w, " would stage more than ", kMaxRowsPerRequest,
                     " rows of table ", table->rows->name(), " for step ", step));
  }
  staged_ids.insert(staged_ids.end(), ids.begin(), ids.end());
  staged_grads.insert(staged_grads.end(), grads.begin(), grads.end());
  return absl::OkStatus();
}

void RowStore::DropStaged(ServerModel* model, int w) {
  for (auto& [name, table] : model->tables) {
    if (static_cast<size_t>(w) < table->staged_ids.size()) {
      table->staged_ids[w].clear();
      table->staged_grads[w].clear();
    }
  }
}

void RowStore::ApplyStaged(ServerModel* model, int64_t step, int contributors) {
  for (auto& [name, t] : model->tables) {
    std::vector<uint64_t> ids;
    std::vector<float> grads;
    for (size_t w = 0; w < t->staged_ids.size(); ++w) {
      ids.insert(ids.end(), t->staged_ids[w].begin(), t->staged_ids[w].end());
      grads.insert(grads.end(), t->staged_grads[w].begin(), t->staged_grads[w].end());
      t->staged_ids[w].clear();
      t->staged_grads[w].clear();
    }
    if (!ids.empty()) {
      // Checked (CheckGradients) when staged, so this cannot fail.
      const float scale = 1.0f / static_cast<float>(std::max(contributors, 1));
      t->rows
          ->ApplyGradients(ids, grads.data(), scale, t->learning_rate.At(step), t->clip_value,
                           step + 1)
          .IgnoreError();
    }
    t->rows->Expire(step + 1);
  }
}

absl::Status RowStore::ApplyNow(ServerModel::Table* table, const std::vector<uint64_t>& ids,
                                const std::vector<float>& grads, float learning_rate,
                                int64_t version) {
  RETURN_IF_ERROR(table->rows->ApplyGradients(ids, grads.data(), 1.0f, learning_rate,
                                              table->clip_value, version));
  table->rows->Expire(version);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RowStore::Load(const ServerModel& model, ServerModel::Table* table,
                                       const std::vector<uint64_t>& ids,
                                       const LoadRowsRequest& request) {
  for (uint64_t id : ids) {
    if (ServerForId(id, model.num_shards) != model.shard) {
      return absl::InvalidArgumentError(absl::StrCat("LoadRows: id ", id, " of table ",
                                                     request.table(), " belongs to server ",
                                                     ServerForId(id, model.num_shards)));
    }
  }
  const size_t n = ids.size(), floats = n * static_cast<size_t>(table->rows->dim());
  auto floats_of = [floats](const std::string& bytes, std::vector<float>* out) {
    if (bytes.size() != floats * sizeof(float)) return false;
    out->resize(floats);
    if (floats > 0) std::memcpy(out->data(), bytes.data(), bytes.size());
    return true;
  };
  auto counts_of = [n](const std::string& bytes, std::vector<int64_t>* out) {
    if (!bytes.empty() && bytes.size() != n * sizeof(int64_t)) return false;
    out->resize(bytes.size() / sizeof(int64_t));
    if (!bytes.empty()) std::memcpy(out->data(), bytes.data(), bytes.size());
    return true;
  };
  std::vector<float> values;
  OptimizerSlots slots(request.slots_size());
  std::vector<int64_t> updates, touched;
  bool ok = floats_of(request.values(), &values) && counts_of(request.updates(), &updates) &&
            counts_of(request.touched(), &touched);
  for (int k = 0; k < request.slots_size(); ++k) ok = ok && floats_of(request.slots(k), &slots[k]);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoadRows: sizes do not fit ", n, " rows of table ", request.table()));
  }
  RETURN_IF_ERROR(table->rows->ImportRows(ids, values.data(), slots, updates, touched));
  return static_cast<int64_t>(n);
}

}  // namespace pstrain
