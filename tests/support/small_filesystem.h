// SmallFileSystem: a file system of a few MiB that a test mounts for
// itself, so that it can fill it and meet a real ENOSPC from the kernel.
//
// tmpfs first (mount(2), which needs CAP_SYS_ADMIN), if it takes O_DIRECT
// (Linux 6.6+; ckptd writes data files with it); otherwise an ext4 image in
// a loop device (mkfs.ext4, mount -o loop). Where neither can be mounted
// (no privilege, no loop device, no mkfs.ext4), mounted() is false and
// skip_reason() says why: the test reports itself skipped (CKPT_SKIP),
// never passed.
//
// The mount is made in a mount namespace of the constructing thread's own
// (unshare(CLONE_NEWNS), inherited by the threads and processes it starts
// afterwards, which is where a test's I/O workers run), so that it vanishes
// with the test process even if that dies without unmounting, and no other
// process ever sees it. The destructor unmounts (lazily if something still
// holds it) and removes the mount point and the image.
//
// Thread-safety: none; one test owns it.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace ckpt::testing {

class SmallFileSystem {
 public:
  explicit SmallFileSystem(uint64_t bytes) {
    if (::unshare(CLONE_NEWNS) != 0) {
      skip_reason_ = std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno);
      return;
    }
    // Nothing mounted here propagates back to the namespace it came from.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      skip_reason_ = std::string("make mounts private: ") + std::strerror(errno);
      return;
    }
    char templ[] = "/tmp/ckpt_small_fs_XXXXXX";
    if (::mkdtemp(templ) == nullptr) {
      skip_reason_ = std::string("mkdtemp: ") + std::strerror(errno);
      return;
    }
    base_ = templ;
    path_ = base_ + "/mnt";
    if (::mkdir(path_.c_str(), 0755) != 0) {
      skip_reason_ = "mkdir " + path_ + ": " + std::strerror(errno);
      return;
    }
    std::string why_not_tmpfs;
    if (MountTmpfs(bytes, &why_not_tmpfs)) return;
    std::string why_not_ext4;
    if (MountExt4(bytes, &why_not_ext4)) return;
    skip_reason_ = "cannot mount a small file system to fill: tmpfs: " +
                   why_not_tmpfs + "; ext4 on a loop device: " + why_not_ext4;
  }
  ~SmallFileSystem() {
    if (mounted_ && ::umount2(path_.c_str(), 0) != 0) {
      ::umount2(path_.c_str(), MNT_DETACH);
    }
    if (!base_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(base_, ec);
    }
  }
  SmallFileSystem(const SmallFileSystem&) = delete;
  SmallFileSystem& operator=(const SmallFileSystem&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& skip_reason() const { return skip_reason_; }
  // The mount point.
  const std::string& path() const { return path_; }
  const std::string& type() const { return type_; }

  // Writes a ballast file at the top of the file system until a write fails
  // with ENOSPC, down to single bytes, so that not one block or page is
  // left. False (with errno's text in `error`) on any other failure.
  bool Fill(std::string* error) {
    const std::string ballast = path_ + "/ballast";
    const int fd = ::open(ballast.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      *error = "open " + ballast + ": " + std::strerror(errno);
      return false;
    }
    const std::vector<char> chunk(64 * 1024, 'b');
    for (size_t size : {chunk.size(), size_t{4096}, size_t{1}}) {
      while (true) {
        const ssize_t n = ::write(fd, chunk.data(), size);
        if (n > 0) continue;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == ENOSPC) break;
        *error = "fill " + ballast + ": " +
                 (n == 0 ? std::string("wrote nothing") : std::strerror(errno));
        ::close(fd);
        return false;
      }
    }
    ::close(fd);
    return true;
  }
  // Removes the ballast: the space is free again.
  bool Unfill() { return ::unlink((path_ + "/ballast").c_str()) == 0; }

 private:
  bool MountTmpfs(uint64_t bytes, std::string* why) {
    const std::string options = "size=" + std::to_string(bytes);
    if (::mount("ckpt-small-fs", path_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      *why = std::string("mount: ") + std::strerror(errno);
      return false;
    }
    mounted_ = true;
    type_ = "tmpfs";
    if (TakesODirect(why)) return true;
    if (::umount2(path_.c_str(), 0) != 0) ::umount2(path_.c_str(), MNT_DETACH);
    mounted_ = false;
    return false;
  }

  bool MountExt4(uint64_t bytes, std::string* why) {
    const std::string image = base_ + "/ext4.img";
    {
      const int fd = ::open(image.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
        *why = std::string("create image: ") + std::strerror(errno);
        if (fd >= 0) ::close(fd);
        return false;
      }
      ::close(fd);
    }
    // -m 0: no blocks reserved for root (the tests run as root).
    if (std::system(("mkfs.ext4 -q -F -m 0 " + image + " >/dev/null 2>&1").c_str()) != 0) {
      *why = "mkfs.ext4 failed or is missing";
      return false;
    }
    if (std::system(("mount -o loop " + image + " " + path_ + " >/dev/null 2>&1").c_str()) != 0) {
      *why = "mount -o loop failed (no loop device, or no privilege)";
      return false;
    }
    mounted_ = true;
    type_ = "ext4";
    if (TakesODirect(why)) return true;
    if (::umount2(path_.c_str(), 0) != 0) ::umount2(path_.c_str(), MNT_DETACH);
    mounted_ = false;
    return false;
  }

  // Whether a 4096-byte aligned O_DIRECT write works here.
  bool TakesODirect(std::string* why) {
    const std::string probe = path_ + "/odirect-probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    if (fd < 0) {
      *why = std::string("O_DIRECT: ") + std::strerror(errno);
      return false;
    }
    void* block = nullptr;
    bool ok = ::posix_memalign(&block, 4096, 4096) == 0;
    if (ok) {
      std::memset(block, 0, 4096);
      ok = ::pwrite(fd, block, 4096, 0) == 4096;
      if (!ok) *why = std::string("O_DIRECT write: ") + std::strerror(errno);
      std::free(block);
    }
    ::close(fd);
    ::unlink(probe.c_str());
    return ok;
  }

  std::string base_, path_, type_, skip_reason_;
  bool mounted_ = false;
};

}  // namespace ckpt::testing
