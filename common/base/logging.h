// Process-wide logging through spdlog: one line per event, each carrying the
// task ("ps:1", "worker:0", "chief:0", "pstrain") so interleaved logs stay readable.
// InitLogging is called from main() before any other thread starts (and
// again by each worker session a Python process opens, worker/session.h);
// the logger itself is thread-safe.
#ifndef PSTRAIN_COMMON_BASE_LOGGING_H_
#define PSTRAIN_COMMON_BASE_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace pstrain {

// Installs a stderr logger whose lines read
// "2026-11-22 10:00:00.123 ps:1 I message". `level` is spdlog's name
// ("debug", "info", "warn", ...); an unknown name means "info".
void InitLogging(const std::string& task, const std::string& level = "info");

}  // namespace pstrain

// Debian's Abseil has its own string_view type; let fmt print it and Status.
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(absl::string_view s, Context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(const absl::Status& st, Context& ctx) const {
    std::string text = st.ToString();
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(text), ctx);
  }
};

#define LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)

#endif  // PSTRAIN_COMMON_BASE_LOGGING_H_
