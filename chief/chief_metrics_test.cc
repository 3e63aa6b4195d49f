#include "chief/chief_metrics.h"

#include <map>
#include <string>

#include "catch2/catch.hpp"
#include "prometheus/metric_family.h"
#include "chief/chief_state.h"

namespace pstrain {
namespace {

// Each sample of `family` as "label=value,..." -> its gauge's value.
std::map<std::string, double> Samples(const std::vector<prometheus::MetricFamily>& families,
                                      const std::string& family) {
  std::map<std::string, double> out;
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != family) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string labels;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        labels += (labels.empty() ? "" : ",") + l.name + "=" + l.value;
      }
      out[labels] = m.gauge.value;
    }
  }
  return out;
}

TEST_CASE("a worker's evaluation is on /metrics, each metric by name", "[chief]") {
  Chief chief(2, 100, /*incarnation=*/9, /*fingerprint=*/5, 0);
  chief.MarkInitialized();
  std::shared_ptr<prometheus::Collectable> metrics = ChiefMetrics(&chief);
  CHECK(Samples(metrics->Collect(), "pstrain_chief_eval_metric").empty());
  CHECK(Samples(metrics->Collect(), "pstrain_chief_eval_step").empty());

  ProgressReport r;
  r.set_incarnation(9);
  r.set_worker(1);
  r.set_global_step(30);
  r.set_eval_step(30);
  for (const auto& [name, value] : {std::pair<std::string, double>{"accuracy", 0.875},
                                    {"loss", 0.5},
                                    {"recall_at_10", 0.25}}) {
    EvalMetric* m = r.add_eval();
    m->set_name(name);
    m->set_value(value);
  }
  ProgressResponse resp;
  REQUIRE(chief.ReportProgress(r, &resp).ok());
  const auto families = metrics->Collect();
  const std::map<std::string, double> want = {{"name=accuracy,worker=1", 0.875},
                                              {"name=loss,worker=1", 0.5},
                                              {"name=recall_at_10,worker=1", 0.25}};
  CHECK(Samples(families, "pstrain_chief_eval_metric") == want);
  CHECK(Samples(families, "pstrain_chief_eval_step") == std::map<std::string, double>{{"", 30}});
  CHECK(Samples(families, "pstrain_chief_eval_accuracy") ==
        std::map<std::string, double>{{"", 0.875}});

  // An evaluation without "accuracy" or "loss" (a click model's AUC): no
  // accuracy or loss of 0 on /metrics.
  ProgressReport auc = r;
  auc.clear_eval();
  auc.set_eval_step(40);
  EvalMetric* m = auc.add_eval();
  m->set_name("auc");
  m->set_value(0.75);
  REQUIRE(chief.ReportProgress(auc, &resp).ok());
  const auto later = metrics->Collect();
  CHECK(Samples(later, "pstrain_chief_eval_metric") ==
        std::map<std::string, double>{{"name=auc,worker=1", 0.75}});
  CHECK(Samples(later, "pstrain_chief_eval_accuracy").empty());
  CHECK(Samples(later, "pstrain_chief_eval_loss").empty());
}

}  // namespace
}  // namespace pstrain
