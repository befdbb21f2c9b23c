// Atomic writes and read-only mappings.
#include "core/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace h2 {

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)), tmp_(cat(path_, ".tmp.", getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(ErrorCode::kIo, cat(path_, ": cannot create ", tmp_, ": ", std::strerror(errno)));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  H2_CHECK(fd_ >= 0) << "write after commit to " << path_;
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::write(fd_, p + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw Error(ErrorCode::kIo, cat(path_, ": write failed after ", written_ + done, " bytes: ", std::strerror(errno),
                                      " (disk full?); the previous file is untouched"));
    }
    done += static_cast<size_t>(n);
  }
  written_ += bytes;
}

void AtomicFileWriter::commit() {
  H2_CHECK(fd_ >= 0) << "commit twice to " << path_;
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp_.c_str());
    throw Error(ErrorCode::kIo, cat(path_, ": cannot flush ", tmp_, ": ", reason));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp_.c_str());
    throw Error(ErrorCode::kIo, cat(path_, ": cannot rename ", tmp_, " over it: ", reason));
  }
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFileWriter writer(path);
  writer.write(content.data(), content.size());
  writer.commit();
}

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

void make_directory(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return;
  if (std::filesystem::exists(path, ec)) {
    throw Error(ErrorCode::kIo, cat(what, " '", path, "' exists and is not a directory; choose another path"));
  }
  std::filesystem::create_directories(path, ec);
  if (ec) throw Error(ErrorCode::kIo, cat(what, " '", path, "': cannot create the directory: ", ec.message()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kIo, cat(path, ": cannot open the file: ", std::strerror(errno)));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorCode::kIo, cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(ErrorCode::kIo, cat(path, ": cannot stat: ", std::strerror(errno)));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      throw Error(ErrorCode::kIo, cat(path, ": cannot map: ", std::strerror(errno)));
    }
    data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace h2
