// Device-side checks: the per-device error word and the errors it reports.
#include "engine/engine.h"

#include <cmath>
#include <cstring>
#include <sstream>

namespace tt::engine {

using hlo::Builder;

StoragePtr Engine::check_word(int device) {
  auto& w = check_words_[device];
  if (!w) {
    w = std::make_shared<Storage>(16, device);
    w->dtype = DType::S64;
    w->typed = true;
    zero_fill(*w);
  }
  return w;
}

void Engine::add_check(Graph& g, Value bad, Value value, bool index_error, const std::string& message) {
  if (!checks_on_) return;
  std::string op = current_op_ ? current_op_->name : "";
  std::string site = current_op_ ? current_op_->site : "";
  if (site.empty() && site_source_) site = site_source_();
  std::string key = op + '\0' + site + '\0' + message + (index_error ? "I" : "R");
  auto it = check_ids_.find(key);
  int64_t id;
  if (it != check_ids_.end()) {
    id = it->second;
  } else {
    if (check_sites_.size() >= (1u << 20)) {  // bounded: old ids then report without their site
      check_sites_.clear();
      check_ids_.clear();
    }
    check_sites_.push_back({op, site, message, index_error});
    id = static_cast<int64_t>(check_sites_.size());
    check_ids_[key] = id;
  }
  // word = word[0] != 0 ? word : (bad ? [id, value] : word)
  hlo::Builder& b = g.b;
  View wv{check_word(g.device), 0, {2}, {1}, DType::S64};
  Value word = g.load(wv);
  Value failed = b.reshape(b.slice(word, {0}, {1}, {1}), {});
  Value mine = b.concatenate({b.reshape(g.scalar_param(static_cast<double>(id), true, DType::S64), {1}),
                              b.reshape(b.convert(value, DType::S64), {1})}, 0);
  Value keep = b.binary(hlo::op::or_, b.compare(failed, b.constant_int(0, DType::S64), hlo::Cmp::NE),
                        b.compare(bad, b.constant_int(0, DType::Pred), hlo::Cmp::EQ));
  g.store(wv, b.select(b.broadcast_to(keep, {2}), word, mine));
}

void Engine::raise_device_errors(int device) {
  auto dirty = check_dirty_.find(device);
  if (dirty == check_dirty_.end() || !dirty->second) return;
  dirty->second = false;
  flush(device);
  StoragePtr w = check_word(device);
  int64_t word[2] = {0, 0};
  w->buffer->to_host(word, sizeof word);
  metrics.d2h_transfers++;
  metrics.d2h_bytes += sizeof word;
  if (word[0] == 0) return;
  w->buffer = nullptr;
  zero_fill(*w);  // the device stays usable
  std::string msg = "a device-side check failed";
  bool index_error = false;
  if (word[0] >= 1 && static_cast<size_t>(word[0]) <= check_sites_.size()) {
    const CheckSite& c = check_sites_[word[0] - 1];
    msg = c.message;
    auto at = msg.find("{}");
    if (at != std::string::npos) msg.replace(at, 2, std::to_string(word[1]));
    at = msg.find("{lo32}");  // two 32-bit numbers packed in the value (an index, a run-time size)
    if (at != std::string::npos) msg.replace(at, 6, std::to_string(static_cast<int32_t>(static_cast<uint64_t>(word[1]))));
    at = msg.find("{hi32}");
    if (at != std::string::npos) msg.replace(at, 6, std::to_string(static_cast<int32_t>(static_cast<uint64_t>(word[1]) >> 32)));
    at = msg.find("{f32,f32}");  // two float32 bit patterns, printed as PyTorch prints numbers
    if (at != std::string::npos) {
      auto f32 = [](uint32_t bits) {
        float f;
        std::memcpy(&f, &bits, sizeof f);
        if (std::isnan(f)) return std::string("nan");
        std::ostringstream o;
        o << f;
        return o.str();
      };
      auto u = static_cast<uint64_t>(word[1]);
      msg.replace(at, 9, f32(static_cast<uint32_t>(u >> 32)) + ", " + f32(static_cast<uint32_t>(u)));
    }
    msg += "\n(torch_tpu: checked on the device in " + c.op + (c.site.empty() ? "" : ", issued at " + c.site) + ")";
    index_error = c.index_error;
  }
  throw DeviceCheckError(msg, index_error);
}

}  // namespace tt::engine
