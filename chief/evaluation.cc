#include "chief/evaluation.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "worker/model/binary_metrics.h"
#include "common/base/status_macros.h"
#include "worker/model/bag_set.h"

namespace pstrain {
namespace {

// A click-through model's evaluation: the held-out examples in chunks, each
// chunk's bags built from the rows of its ids as the servers hold them now.
absl::Status EvaluateClickThrough(PsClient* ps, Model* model, const TrainingConfig& config,
                                  const Dataset& test, EvalResult* result) {
  const std::unique_ptr<BagSet> bags = BagSet::ForConfig(config, test.dim, nullptr);
  constexpr int64_t kChunk = 8192;
  *result = EvalResult();
  double loss = 0;
  std::vector<float> x;
  for (int64_t start = 0; start < test.size; start += kChunk) {
    const int n = static_cast<int>(std::min(kChunk, test.size - start));
    bags->Index(test.ids.data() + start * test.id_fields, n);
    RETURN_IF_ERROR(
        ps->PullTables(TableRowsOf(bags.get(), /*gradients=*/false), 0, absl::ZeroDuration()));
    x.resize(static_cast<size_t>(n) * bags->output_dim());
    bags->Forward(test.x.data() + start * test.dim, x.data());
    EvalResult part;
    RETURN_IF_ERROR(model->Evaluate(x.data(), test.y.data() + start, n, &part));
    loss += part.loss * n;
    result->correct += part.correct;
    result->scores.insert(result->scores.end(), part.scores.begin(), part.scores.end());
  }
  result->count = test.size;
  result->loss = test.size > 0 ? loss / static_cast<double>(test.size) : 0;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Evaluation> Evaluate(PsClient* ps, Model* model, const TrainingConfig& config,
                                    const Dataset* test, std::vector<Tensor>* params) {
  PsClient::PullResult pulled;
  const bool into_model = test != nullptr && model != nullptr;
  if (into_model) {
    params->clear();
    RETURN_IF_ERROR(
        ps->PullInto({}, absl::ZeroDuration(), model->host_parameter_pointers(), &pulled));
  } else {
    RETURN_IF_ERROR(ps->PullAll({}, absl::ZeroDuration(), params, &pulled));
  }
  Evaluation e;
  e.step = *std::min_element(pulled.versions.begin(), pulled.versions.end());
  if (into_model) {
    RETURN_IF_ERROR(model->UploadParameters());
    if (config.model().has_click_through()) {
      RETURN_IF_ERROR(EvaluateClickThrough(ps, model, config, *test, &e.result));
    } else {
      RETURN_IF_ERROR(model->Evaluate(test->x.data(), test->y.data(), test->size, &e.result));
    }
    if (!e.result.scores.empty()) {
      absl::StatusOr<double> auc = RocAuc(e.result.scores, test->y);
      if (auc.ok()) e.auc = *auc;
      e.log_loss = LogLoss(e.result.scores, test->y);
    }
  }
  return e;
}

std::vector<const float*> ParameterValues(Model* model, const std::vector<Tensor>& params) {
  std::vector<const float*> values;
  if (params.empty() && model != nullptr) {
    for (size_t v = 0; v < model->variables().size(); ++v) values.push_back(model->host_parameters(v));
  } else {
    for (const Tensor& t : params) values.push_back(t.data());
  }
  return values;
}

}  // namespace pstrain
