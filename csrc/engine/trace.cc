// The trace cache: recorded op sequences replayed without building program text.
#include "engine/engine.h"

#include <cmath>
#include <cstring>

namespace tt::engine {

using hlo::Builder;

// ---- traces
void Engine::begin_op(Graph& g, const std::string* key, const CurrentFn& current) {
  if (!key || !trace_on_) {
    leave_trace(g);
    g.traceable = false;
    return;
  }
  if (!g.traceable) return;
  size_t i = g.ops.size();
  auto reads_match = [&](const lower::Reads& r) {
    for (const auto& x : r) {
      double c = current ? current(x.arg) : std::nan("");
      if (x.test < 0 ? std::memcmp(&c, &x.value, sizeof c) != 0 : (c == x.value) != (x.test == 1)) return false;
    }
    return true;
  };
  auto fits = [&](const Trace& t) { return i < t.keys.size() && t.keys[i] == *key && reads_match(t.reads[i]); };
  if (i == 0) {
    if (g.trace) {  // chosen for a first op that failed and was rolled back
      g.trace = nullptr;
      g.b.set_dry(false);
    }
    auto* bucket = traces_.find(*key);
    if (!bucket) return;
    for (const auto& t : *bucket)
      if (fits(*t)) {
        g.trace = t;
        g.b.set_dry(!trace_verify_);
        return;
      }
    return;
  }
  if (!g.trace) return;
  if (fits(*g.trace)) return;
  // another recorded trace that shares this graph's ops so far?
  if (auto* bucket = traces_.find(g.keys[0]))
    for (const auto& t : *bucket) {
      if (t == g.trace || !fits(*t)) continue;
      bool same = true;
      for (size_t k = 0; same && k < i; ++k) same = t->keys[k] == g.keys[k] && t->reads[k] == g.reads[k];
      if (same) {
        g.trace = t;
        return;
      }
    }
  leave_trace(g);
}

void Engine::leave_trace(Graph& g) {
  if (!g.trace) return;
  if (g.b.dry()) {  // the text the ops so far produced when the trace was recorded
    size_t n = g.ops.size();
    g.b.materialize(g.trace->body.substr(0, g.trace->marks[n]));
    for (size_t k = 0; k < n; ++k) g.sites[k].body_start = g.trace->marks[k];
  }
  g.trace = nullptr;
  metrics.trace_exits++;
}

void Engine::record_trace(Graph& g, const std::vector<int>& outs, const Program& p) {
  if (!trace_on_ || !g.traceable || g.ops.empty()) return;
  auto t = std::make_shared<Trace>();
  t->keys = std::move(g.keys);
  t->reads = std::move(g.reads);
  for (auto& s : g.sites) t->marks.push_back(s.body_start);
  t->body = g.b.body_text();
  t->marks.push_back(t->body.size());
  t->outs = outs;
  t->aliases = p.donations;
  t->exe = p.exe;
  t->text = p.text;
  auto& bucket = traces_[t->keys[0]];
  for (auto it = bucket.begin(); it != bucket.end(); ++it)
    if ((*it)->keys == t->keys && (*it)->reads == t->reads && (*it)->outs == t->outs && (*it)->aliases == t->aliases) {
      bucket.erase(it);
      break;
    }
  bucket.insert(bucket.begin(), std::move(t));
  if (bucket.size() > 8) bucket.pop_back();
  metrics.trace_recorded++;
}

}  // namespace tt::engine
