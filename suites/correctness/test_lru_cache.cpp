// harness/lru_cache.hpp: the bound of the cuDNN graph cache (and of any cache that
// must not grow with the shapes a process goes through).
#include "harness/lru_cache.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace {

using Cache = hr::LruCache<int, std::string>;

std::vector<int> keys(const std::vector<Cache::Entry>& e) {
  std::vector<int> k;
  for (const auto& x : e) k.push_back(x.first);
  return k;
}

std::shared_ptr<std::string> value(int k) { return std::make_shared<std::string>("v" + std::to_string(k)); }

// Inserting past the capacity pushes out the least recently used, where a look-up
// counts as a use; every push-out is handed back, oldest first, with its value.
TEST(LruCache, PushesOutTheLeastRecentlyUsedAndHandsItBack) {
  Cache c(3);
  for (int k : {1, 2, 3}) EXPECT_TRUE(c.insert(k, value(k)).empty());
  ASSERT_NE(c.find(1), nullptr);  // 1 is now the newest: 2 is the oldest
  const std::vector<Cache::Entry> out = c.insert(4, value(4));
  EXPECT_EQ(keys(out), std::vector<int>{2});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(*out[0].second, "v2");
  EXPECT_EQ(c.find(2), nullptr);
  for (int k : {1, 3, 4}) {
    ASSERT_NE(c.find(k), nullptr) << k;
    EXPECT_EQ(*c.find(k), "v" + std::to_string(k));
  }
  EXPECT_EQ(c.size(), 3u);
  // Uses in the order 1, 3, 4: 1 is the oldest now, then 3.
  EXPECT_EQ(keys(c.insert(5, value(5))), std::vector<int>{1});
  EXPECT_EQ(keys(c.insert(6, value(6))), std::vector<int>{3});
}

// A value taken from the cache stays alive after the cache pushes it out, until its
// last holder lets go.
TEST(LruCache, AValueOutlivesItsPlaceWhileHeld) {
  Cache c(1);
  c.insert(1, value(1));
  std::weak_ptr<std::string> watch = c.find(1);
  std::shared_ptr<std::string> held = c.find(1);
  std::vector<Cache::Entry> out = c.insert(2, value(2));
  ASSERT_EQ(keys(out), std::vector<int>{1});
  out.clear();
  ASSERT_FALSE(watch.expired());
  EXPECT_EQ(*held, "v1");
  held.reset();
  EXPECT_TRUE(watch.expired());
}

// Inserting a key it holds replaces the value (handing the old one back) and makes it
// the newest; a smaller capacity pushes out the oldest at once.
TEST(LruCache, ReplacesAKeyAndShrinksOnASmallerCapacity) {
  Cache c(3);
  for (int k : {1, 2, 3}) c.insert(k, value(k));
  const std::vector<Cache::Entry> replaced = c.insert(1, std::make_shared<std::string>("new"));
  ASSERT_EQ(keys(replaced), std::vector<int>{1});
  EXPECT_EQ(*replaced[0].second, "v1");
  EXPECT_EQ(*c.find(1), "new");
  EXPECT_EQ(c.size(), 3u);
  EXPECT_EQ(keys(c.set_capacity(1)), (std::vector<int>{2, 3}));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.capacity(), 1u);
  EXPECT_EQ(*c.find(1), "new");
  EXPECT_THROW(c.set_capacity(0), std::exception);
  EXPECT_THROW(Cache(0), std::exception);
}

}  // namespace
