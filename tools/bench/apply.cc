// The apply suite of `pstrain bench` (ApplySuite, run by the harness,
// tools/bench/harness.cc): GB/s of gradient through every server-side
// optimizer's update (sgd, momentum, nesterov, adagrad, adam, adamw, ftrl)
// over 16 MiB, in process and on one thread, beside a plain a += b loop over
// the same memory: the memory-bound floor of any update (reads two arrays,
// writes one). //tools:bench is built with -O3 so that the loop gets the
// server's own optimisation.

#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/base/tensor.h"
#include "google/protobuf/text_format.h"
#include "ps_server/optimizer.h"
#include "tools/bench/harness.h"

namespace pstrain::bench {

absl::Status ApplySuite(BenchContext* ctx) {
  const BenchOptions& o = ctx->options();
  const int64_t n = int64_t{4} << 20;  // 16 MiB of float32, past the caches
  struct Kind {
    std::string name;
    std::unique_ptr<Optimizer> optimizer;
    OptimizerSlots slots;
    std::vector<double> rates;
  };
  std::vector<Kind> kinds;
  for (const char* text : {"sgd {}", "momentum {}", "momentum { nesterov: true }", "adagrad {}",
                           "adam {}", "adamw {}", "ftrl {}"}) {
    OptimizerConfig oc;
    if (!google::protobuf::TextFormat::ParseFromString(text, &oc)) {
      return absl::InternalError(absl::StrCat("apply bench: bad optimizer ", text));
    }
    oc.set_learning_rate(1e-6f);
    Kind k;
    ASSIGN_OR_RETURN(k.optimizer, CreateOptimizer(oc));
    k.name = k.optimizer->name();
    k.optimizer->InitSlots(n, &k.slots);
    kinds.push_back(std::move(k));
  }
  std::vector<float> a(n, 1.0f), b(n, 1e-3f);
  std::vector<double> plain;
  auto rate = [&](const std::function<void()>& body) {
    int64_t passes = 0;
    const absl::Time start = absl::Now();
    do {
      body();
      ++passes;
    } while (absl::Now() - start < absl::Seconds(o.rep_seconds));
    return static_cast<double>(passes) * n * 4 / absl::ToDoubleSeconds(absl::Now() - start) / 1e9;
  };
  UpdateInfo update;
  update.learning_rate = 1e-6f;
  for (int rep = 0; rep < o.reps; ++rep) {
    plain.push_back(rate([&] {
      float* x = a.data();
      const float* y = b.data();
      for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    }));
    for (Kind& k : kinds) {
      k.rates.push_back(rate([&] {
        k.optimizer->Apply(absl::MakeSpan(a), b, &k.slots, update);
        ++update.count;
      }));
    }
  }
  if (!AllFinite(a)) return absl::InternalError("apply bench: values went non-finite");
  const Stats sp = Summarize(plain);
  std::cout << "\n== apply: GB/s of gradient over 16 MiB (median [min-max] of " << o.reps
            << ") ==\n";
  std::cout << absl::StrFormat("%-24s %s   slots\n", "a += b", Fmt(sp));
  ctx->Add("apply", "a_plus_b", n * 4, 0, 1, sp);
  for (const Kind& k : kinds) {
    const Stats st = Summarize(k.rates);
    std::cout << absl::StrFormat("%-24s %s   %zu   %.2fx of a += b\n", k.name + " (server)",
                                 Fmt(st), k.slots.size(), st.median / sp.median);
    ctx->Add("apply", k.name, n * 4, 1, 1, st);
  }
  return absl::OkStatus();
}

}  // namespace pstrain::bench
