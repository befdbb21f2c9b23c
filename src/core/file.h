// Files written so that nothing already there is lost: write_file_atomic() writes a temporary file beside
// the target, flushes it to disk and renames it over the target, so a reader sees the old or the new
// content, never a torn one. MappedFile maps a file read-only.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace h2 {

// Writes `path` through a temporary file beside it; commit() flushes and renames it into place. A writer
// destroyed without commit() removes the temporary file and leaves `path` as it was.
// Errors are Error(kIo) naming the path and the system's reason.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  size_t written_ = 0;
};

void write_file_atomic(const std::string& path, std::string_view content);
// Creates the directory `path` (and its parents) if missing. Error(kIo) names `what` (e.g. "train.out_dir"), the path
// and the reason: a file in the way, no permission, a full disk.
void make_directory(const std::string& path, const std::string& what);
std::string read_file(const std::string& path);

// An open file descriptor, closed when destroyed (so a constructor that throws after opening leaks nothing).
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws Error(kIo)
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace h2
