// The one way headroom writes an output file: results, reports, plans, JUnit,
// dumps. What is at the path decides how:
// - nothing, or a regular file: the bytes go to a temporary file in the same
//   folder, which is flushed to disk (fsync) and renamed over the path, and the
//   folder is flushed too; a reader sees the old file or the new one, never part
//   of one, and a failure leaves no temporary behind. An existing file keeps its
//   permission bits (a new one is 0644 under the umask);
// - a symbolic link: followed to its final target (a dangling link's target is
//   created), which is then written as above; the link stays a link;
// - a character device or a FIFO: written into directly, never replaced (a FIFO
//   that no process reads is refused rather than waited on);
// - anything else (a folder, a block device, a socket) and a link loop: refused.
// Every error is hr::Error (InvalidArgument for what is at the path) naming the
// path and the system's reason.
#pragma once

#include <cstddef>
#include <string>

namespace hr {

class OutputFile {
 public:
  explicit OutputFile(const std::string& path);
  ~OutputFile();  // not committed: the temporary is removed, the target untouched
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // Flushes and puts the file in place; the content is not there before.
  void commit();

  // What the path resolved to (the link's target for a link), and whether the
  // bytes go there directly (a device or a FIFO) rather than through a rename.
  const std::string& target() const { return target_; }
  bool direct() const { return direct_; }

 private:
  [[noreturn]] void fail(const char* step, int err);

  std::string path_, target_, tmp_;
  int fd_ = -1;
  bool direct_ = false, committed_ = false;
  unsigned mode_ = 0644;
};

// The whole content at once, through OutputFile.
void write_output(const std::string& path, const std::string& content);

}  // namespace hr
