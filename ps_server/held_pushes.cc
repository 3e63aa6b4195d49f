#include "ps_server/held_pushes.h"

#include <algorithm>
#include <utility>

namespace pstrain {

int HeldPushes::Push::parts_in() const {
  return static_cast<int>(std::count(got.begin(), got.end(), 1));
}

void HeldPushes::Reset(int num_workers) {
  pushes_.clear();
  pushes_.resize(static_cast<size_t>(num_workers));
  checked_ = absl::InfinitePast();
}

bool HeldPushes::IsPartOf(int w, const PushRequest& header) const {
  const Push& h = pushes_[w];
  return h.id != 0 && h.session == header.session() && h.step == header.step() &&
         h.seq == header.push_seq() && h.num_parts == header.num_parts();
}

bool HeldPushes::IsEarlier(int w, const PushRequest& header) const {
  const Push& h = pushes_[w];
  if (h.id == 0 || IsPartOf(w, header)) return false;
  if (header.session() != h.session) return header.session() < h.session;
  if (header.step() != h.step) return header.step() < h.step;
  return header.push_seq() < h.seq;
}

HeldPushes::Push& HeldPushes::Start(int w, const PushRequest& header, absl::Time now, bool finished,
                                    UpdateInfo update) {
  Push& h = pushes_[w];
  h = Push();
  h.id = next_id_++;
  h.session = header.session();
  h.step = header.step();
  h.seq = header.push_seq();
  h.started = now;
  h.num_parts = header.num_parts();
  h.got.assign(static_cast<size_t>(h.num_parts), 0);
  h.finished = finished;
  if (!finished) h.update = update;
  return h;
}

bool HeldPushes::Drop(int w, std::string why) {
  Push& h = pushes_[w];
  if (!h.open()) return false;
  h.closed = "it was dropped: " + why;
  return !h.finished;
}

absl::Time HeldPushes::NextExpiry(absl::Duration ttl) const {
  absl::Time next = absl::InfiniteFuture();
  for (const Push& h : pushes_) {
    if (h.open()) next = std::min(next, h.started + ttl);
  }
  return next;
}

std::vector<int> HeldPushes::Overdue(absl::Time now, absl::Duration ttl, bool throttled) {
  std::vector<int> out;
  if (throttled && now - checked_ < std::min(ttl, absl::Seconds(1))) return out;
  checked_ = now;
  for (size_t w = 0; w < pushes_.size(); ++w) {
    const Push& h = pushes_[w];
    if (h.open() && now - h.started > ttl) out.push_back(static_cast<int>(w));
  }
  return out;
}

}  // namespace pstrain
