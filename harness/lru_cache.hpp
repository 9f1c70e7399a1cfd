// A cache of at most `capacity` values, the least recently used pushed out first.
// Values are shared: a caller that took one keeps it alive after it is pushed out,
// and what the cache pushes out is handed back to the caller of insert(), so that
// releasing it (which may wait for a device) happens where the caller chooses.
// Not synchronised: callers that share one take a lock around it.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "harness/check.hpp"

namespace hr {

template <typename K, typename V, typename Less = std::less<K>>
class LruCache {
 public:
  using Entry = std::pair<K, std::shared_ptr<V>>;

  explicit LruCache(size_t capacity) : capacity_(capacity) {
    HR_ARG_CHECK(capacity > 0, "an LRU cache holds at least one value");
  }

  // The value of k, now the most recently used; null when k is not held.
  std::shared_ptr<V> find(const K& k) {
    auto it = index_.find(k);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }

  // Holds v as k's value, the most recently used (replacing what k held); returns the
  // entries pushed out to stay within the capacity, the least recently used first.
  std::vector<Entry> insert(const K& k, std::shared_ptr<V> v) {
    std::vector<Entry> out;
    if (auto it = index_.find(k); it != index_.end()) {
      out.push_back(std::move(*it->second));
      order_.erase(it->second);
      index_.erase(it);
    }
    order_.emplace_front(k, std::move(v));
    index_.emplace(k, order_.begin());
    trim(out);
    return out;
  }

  // Holds at most `capacity` from now on; returns the entries pushed out to get there,
  // the least recently used first.
  std::vector<Entry> set_capacity(size_t capacity) {
    HR_ARG_CHECK(capacity > 0, "an LRU cache holds at least one value");
    capacity_ = capacity;
    std::vector<Entry> out;
    trim(out);
    return out;
  }

  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  void trim(std::vector<Entry>& out) {
    while (order_.size() > capacity_) {
      index_.erase(order_.back().first);
      out.push_back(std::move(order_.back()));
      order_.pop_back();
    }
  }

  size_t capacity_;
  std::list<Entry> order_;  // the most recently used first
  std::map<K, typename std::list<Entry>::iterator, Less> index_;
};

}  // namespace hr
