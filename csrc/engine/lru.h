// A bounded map that forgets its least recently used entry once full: every cache of the engine
// (executables, scalar buffers, recorded traces, per-op-sequence compile counts, size-policy sites,
// live sizes).
#pragma once

#include <cstddef>
#include <list>
#include <unordered_map>
#include <utility>

namespace tt::engine {

template <class K, class V>
class Lru {
 public:
  explicit Lru(size_t capacity) : capacity_(capacity ? capacity : 1) {}
  // The value of k, now the most recently used; nullptr when absent.
  V* find(const K& k) {
    auto it = index_.find(k);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }
  // The value of k without touching the order.
  const V* peek(const K& k) const {
    auto it = index_.find(k);
    return it == index_.end() ? nullptr : &it->second->second;
  }
  // The value of k (a default one inserted when absent), now the most recently used.
  V& operator[](const K& k) {
    if (V* v = find(k)) return *v;
    return insert(k, V{});
  }
  V& put(const K& k, V v) {
    if (V* old = find(k)) return *old = std::move(v);
    return insert(k, std::move(v));
  }
  size_t size() const { return index_.size(); }
  template <class F>
  void for_each(F f) const {
    for (const auto& [k, v] : order_) f(k, v);
  }
  size_t capacity() const { return capacity_; }
  void clear() {
    index_.clear();
    order_.clear();
  }

 private:
  V& insert(const K& k, V v) {
    if (index_.size() >= capacity_) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
    order_.emplace_front(k, std::move(v));
    index_.emplace(k, order_.begin());
    return order_.front().second;
  }
  size_t capacity_;
  std::list<std::pair<K, V>> order_;  // most recent first
  std::unordered_map<K, typename std::list<std::pair<K, V>>::iterator> index_;
};

}  // namespace tt::engine
