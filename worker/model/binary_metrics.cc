#include "worker/model/binary_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace pstrain {

absl::StatusOr<double> RocAuc(const std::vector<float>& scores,
                              const std::vector<int32_t>& labels) {
  if (scores.size() != labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("AUC: ", scores.size(), " scores for ",
                                                   labels.size(), " labels"));
  }
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positive_rank_sum = 0;
  int64_t positives = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double mean_rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;  // ties
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] != 0) {
        positive_rank_sum += mean_rank;
        ++positives;
      }
    }
    i = j;
  }
  const int64_t negatives = static_cast<int64_t>(labels.size()) - positives;
  if (positives == 0 || negatives == 0) {
    return absl::InvalidArgumentError("AUC: needs both positive and negative labels");
  }
  const double p = static_cast<double>(positives);
  return (positive_rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(negatives));
}

double LogLoss(const std::vector<float>& probabilities, const std::vector<int32_t>& labels) {
  double sum = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const double q = std::min(std::max(static_cast<double>(probabilities[i]), 1e-7), 1 - 1e-7);
    sum -= labels[i] != 0 ? std::log(q) : std::log(1 - q);
  }
  return labels.empty() ? 0 : sum / static_cast<double>(labels.size());
}

}  // namespace pstrain
