// The engine's bounded caches: the least recently used entry goes first.
#include <gtest/gtest.h>

#include <string>

#include "engine/lru.h"

using tt::engine::Lru;

TEST(Lru, ForgetsTheLeastRecentlyUsedEntry) {
  Lru<std::string, int> c(2);
  c.put("a", 1);
  c.put("b", 2);
  ASSERT_NE(c.find("a"), nullptr);  // "a" used: "b" is now the oldest
  c.put("c", 3);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(c.find("b"), nullptr);
  EXPECT_EQ(*c.find("a"), 1);
  EXPECT_EQ(*c.find("c"), 3);
  EXPECT_NE(c.peek("a"), nullptr);  // peek does not reorder: "a" stays older than "c"
  c.put("d", 4);
  EXPECT_EQ(c.peek("a"), nullptr);
  EXPECT_EQ(*c.peek("c"), 3);
}

TEST(Lru, IndexInsertsADefaultAndPutReplaces) {
  Lru<int, int> c(3);
  ++c[7];
  ++c[7];
  EXPECT_EQ(c[7], 2);
  c.put(7, 10);
  EXPECT_EQ(*c.peek(7), 10);
  EXPECT_EQ(c.size(), 1u);
  int sum = 0;
  c.put(1, 1);
  c.for_each([&](int, int v) { sum += v; });
  EXPECT_EQ(sum, 11);
  c.clear();
  EXPECT_EQ(c.size(), 0u);
}
