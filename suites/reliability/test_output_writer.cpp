// The output writer (harness/output.hpp), on what can be at an output path, each
// made in a test folder: nothing, a regular file, links (to a file, dangling, in a
// loop, to a link), a folder, a FIFO with and without a reader, a character
// device (a copy of /dev/null's node, where the test may create one), and a full
// device. Nothing at the path is ever replaced by something of another kind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "harness/check.hpp"
#include "harness/output.hpp"
#include "harness/plan/plan.hpp"
#include "suites/common/test_support.hpp"

namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Files in `dir` whose name holds ".tmp.": a writer's temporaries.
int temporaries(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
  return n;
}

TEST(OutputWriter, ANewFileAndAReplacedOneAreWholeAndKeepTheirMode) {
  hr::test::TempDir t;
  const fs::path p = t.path / "out.json";
  hr::write_output(p.string(), "first\n");
  EXPECT_EQ(slurp(p), "first\n");
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write);  // 0600
  hr::write_output(p.string(), "second\n");
  EXPECT_EQ(slurp(p), "second\n");
  EXPECT_EQ(fs::status(p).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(temporaries(t.path), 0);
}

TEST(OutputWriter, ALinkIsFollowedAndStaysALink) {
  hr::test::TempDir t;
  const fs::path file = t.path / "real.html", link = t.path / "link.html", link2 = t.path / "link2.html";
  hr::write_output(file.string(), "old");
  fs::create_symlink("real.html", link);  // relative, as users make them
  fs::create_symlink(link, link2);        // a link to a link
  hr::write_output(link2.string(), "new");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(fs::is_symlink(link2));
  EXPECT_EQ(slurp(file), "new");
  // A dangling link: its target is created, the link kept.
  const fs::path dangling = t.path / "dangling.json";
  fs::create_symlink(t.path / "made_by_the_writer.json", dangling);
  hr::write_output(dangling.string(), "made");
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_EQ(slurp(t.path / "made_by_the_writer.json"), "made");
  EXPECT_EQ(temporaries(t.path), 0);
}

TEST(OutputWriter, ALinkLoopAndAFolderAreRefused) {
  hr::test::TempDir t;
  fs::create_symlink(t.path / "b", t.path / "a");
  fs::create_symlink(t.path / "a", t.path / "b");
  try {
    hr::write_output((t.path / "a").string(), "x");
    ADD_FAILURE() << "a link loop was written";
  } catch (const hr::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("loop"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_symlink(t.path / "a"));
  fs::create_directory(t.path / "folder");
  try {
    hr::write_output((t.path / "folder").string(), "x");
    ADD_FAILURE() << "a folder was replaced";
  } catch (const hr::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a folder"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(t.path / "folder"));
  EXPECT_EQ(temporaries(t.path), 0);
}

TEST(OutputWriter, AFifoIsWrittenIntoAndOneWithoutAReaderRefused) {
  hr::test::TempDir t;
  const fs::path fifo = t.path / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  try {
    hr::write_output(fifo.string(), "nobody reads");
    ADD_FAILURE() << "a FIFO without a reader was written (or waited on)";
  } catch (const hr::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no process reads"), std::string::npos) << e.what();
  }
  std::string got;
  std::thread reader([&] {
    const int fd = ::open(fifo.c_str(), O_RDONLY);
    char buf[64];
    ssize_t n;
    while (fd >= 0 && (n = ::read(fd, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(n));
    if (fd >= 0) ::close(fd);
  });
  // The reader may not have opened yet: retry until it has (the writer refuses, never blocks).
  bool written = false;
  for (int i = 0; i < 500 && !written; ++i) {
    try {
      hr::write_output(fifo.string(), "through the pipe\n");
      written = true;
    } catch (const hr::InvalidArgument&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  reader.join();
  EXPECT_TRUE(written);
  EXPECT_EQ(got, "through the pipe\n");
  EXPECT_EQ(fs::status(fifo).type(), fs::file_type::fifo);
  EXPECT_EQ(temporaries(t.path), 0);
}

// A reader that goes away mid-write: EPIPE, said as such, and no SIGPIPE to end the
// process without a word.
TEST(OutputWriter, AFifoWhoseReaderLeavesIsAnErrorNotASignal) {
  hr::test::TempDir t;
  const fs::path fifo = t.path / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0) << std::strerror(errno);
  hr::OutputFile out(fifo.string());
  ::close(reader);
  try {
    out.write(std::string(1 << 16, 'x'));
    ADD_FAILURE() << "a write into a FIFO without a reader succeeded";
  } catch (const hr::Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::strerror(EPIPE)), std::string::npos) << e.what();
  }
}

TEST(OutputWriter, ACharacterDeviceIsWrittenIntoNeverReplaced) {
  hr::test::TempDir t;
  const fs::path dev = t.path / "null";
  if (::mknod(dev.c_str(), S_IFCHR | 0666, ::makedev(1, 3)) != 0)
    GTEST_SKIP() << "cannot create a device node in the test folder (" << std::strerror(errno)
                 << "): needs CAP_MKNOD";
  hr::write_output(dev.string(), std::string(1 << 16, 'x'));
  EXPECT_EQ(fs::status(dev).type(), fs::file_type::character) << "the device node was replaced";
  // /dev/full's node: every write fails with ENOSPC, said with the system's words.
  const fs::path full = t.path / "full";
  ASSERT_EQ(::mknod(full.c_str(), S_IFCHR | 0666, ::makedev(1, 7)), 0) << std::strerror(errno);
  try {
    hr::write_output(full.string(), "x");
    ADD_FAILURE() << "a write to a full device succeeded";
  } catch (const hr::Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOSPC)), std::string::npos) << e.what();
  }
  EXPECT_EQ(fs::status(full).type(), fs::file_type::character);
  EXPECT_EQ(temporaries(t.path), 0);
}

TEST(OutputWriter, PlanRefusesAJsonOutputThatIsOneOfItsInputs) {
  hr::test::TempDir t;
  const fs::path cfg = t.path / "cfg.json", cards = t.path / "cards.json", link = t.path / "cards_link.json";
  hr::write_output(cfg.string(), R"({"model": "mlp"})");
  hr::write_output(cards.string(), R"({"cards": [{"name": "small", "memory_gib": 16}]})");
  fs::create_symlink(cards, link);
  const std::string cards_before = slurp(cards);
  for (const fs::path& out : {cfg, link}) {
    hr::plan::PlanCommand c;
    c.config_file = cfg.string();
    c.cards_file = cards.string();
    c.json_out = out.string();
    std::ostringstream o, e;
    EXPECT_EQ(hr::plan::command_plan(c, o, e), 2) << out;
    EXPECT_NE(e.str().find("refusing to overwrite an input"), std::string::npos) << e.str();
  }
  EXPECT_EQ(slurp(cards), cards_before);
  EXPECT_EQ(slurp(cfg), R"({"model": "mlp"})");
}

}  // namespace
