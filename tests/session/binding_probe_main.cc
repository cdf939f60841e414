// ckpt-binding-probe: the other process of the memory-binding tests
// (peer_binding_test.cc). It maps a fixed address, so the memory a session
// registered before an exec lies at the same address in the program the
// process runs after it:
//
//   ckpt-binding-probe trainer SOCKET ADDRESS BYTES [--uid U [--saved-uid S]
//                      [--undumpable]] [--no-frame]
//     fills [ADDRESS, +BYTES) with the trainer pattern, optionally drops to
//     uid/gid U (saved uid S, default U; dumpable again unless
//     --undumpable), connects to the handshake socket SOCKET, prints
//     "token <32 hex digits>" (or "connected" if the other end sends no
//     handshake frame: --no-frame), then obeys one command per stdin line:
//       exec PATH    run PATH as "image" (the handshake socket stays open,
//                    as an attacker would keep it, so the session lives on)
//       setuid U     setresuid(U, U, U) without exec; prints "ok"
//       dumpable     prctl(PR_SET_DUMPABLE, 1); prints "ok"
//       check        prints "trainer" if the memory holds the trainer
//                    pattern, else "changed"
//       exit
//   ckpt-binding-probe image ADDRESS BYTES
//     fills the same range with the canary pattern (the secret of the
//     program a session must not reach), prints "image euid E ruid R", then
//     obeys "check" (prints "canary" or "changed") and "exit".
//
// Only C library calls: it may run setuid root.
#include <grp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

// Must match peer_binding_test.cc.
unsigned char TrainerByte(uint64_t i) {
  return static_cast<unsigned char>(i * 7 + 0x11);
}
unsigned char CanaryByte(uint64_t i) {
  return static_cast<unsigned char>(i * 13 + 0xc3);
}

[[noreturn]] void Die(const char* what) {
  std::fprintf(stdout, "error %s: %s\n", what, std::strerror(errno));
  std::fflush(stdout);
  std::exit(2);
}

unsigned char* MapFixed(uint64_t address, uint64_t bytes) {
  void* p =
      ::mmap(reinterpret_cast<void*>(address), bytes, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p == MAP_FAILED) Die("mmap");
  if (reinterpret_cast<uint64_t>(p) != address) {
    errno = EEXIST;
    Die("mmap at the fixed address");
  }
  return static_cast<unsigned char*>(p);
}

bool Holds(const unsigned char* data, uint64_t bytes,
           unsigned char (*pattern)(uint64_t)) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (data[i] != pattern(i)) return false;
  }
  return true;
}

void Say(const char* line) {
  std::fprintf(stdout, "%s\n", line);
  std::fflush(stdout);
}

// Reads one command line into `line` (without the newline); false at EOF.
bool Command(char* line, size_t size) {
  if (std::fgets(line, static_cast<int>(size), stdin) == nullptr) return false;
  line[std::strcspn(line, "\n")] = '\0';
  return true;
}

int Image(uint64_t address, uint64_t bytes) {
  unsigned char* data = MapFixed(address, bytes);
  for (uint64_t i = 0; i < bytes; ++i) data[i] = CanaryByte(i);
  std::fprintf(stdout, "image euid %u ruid %u\n", ::geteuid(), ::getuid());
  std::fflush(stdout);
  char line[256];
  while (Command(line, sizeof(line))) {
    if (std::strcmp(line, "check") == 0) {
      Say(Holds(data, bytes, CanaryByte) ? "canary" : "changed");
    } else if (std::strcmp(line, "exit") == 0) {
      return 0;
    }
  }
  return 0;
}

int Trainer(const char* socket_path, uint64_t address, uint64_t bytes, int argc,
            char** argv) {
  long uid = -1, saved_uid = -1;
  bool undumpable = false, frame_expected = true;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--uid") == 0 && i + 1 < argc) {
      uid = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "--saved-uid") == 0 && i + 1 < argc) {
      saved_uid = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "--undumpable") == 0) {
      undumpable = true;
    } else if (std::strcmp(argv[i], "--no-frame") == 0) {
      frame_expected = false;
    }
  }
  unsigned char* data = MapFixed(address, bytes);
  for (uint64_t i = 0; i < bytes; ++i) data[i] = TrainerByte(i);
  if (uid >= 0) {
    const auto id = static_cast<uid_t>(uid);
    if (::setgroups(0, nullptr) != 0) Die("setgroups");
    if (::setresgid(id, id, id) != 0) Die("setresgid");
    if (::setresuid(id, id,
                    saved_uid >= 0 ? static_cast<uid_t>(saved_uid) : id) != 0) {
      Die("setresuid");
    }
    // Dropping privileges made this process undumpable; a trainer that
    // wants the daemon to read it says so again.
    if (!undumpable && ::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0)
      Die("PR_SET_DUMPABLE");
  }
  // Not close-on-exec: the session must outlive the exec.
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) Die("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (std::strlen(socket_path) >= sizeof(addr.sun_path)) {
    errno = ENAMETOOLONG;
    Die("socket path");
  }
  std::strcpy(addr.sun_path, socket_path);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    Die("connect");
  if (frame_expected) {
    unsigned char frame[20];
    size_t got = 0;
    while (got < sizeof(frame)) {
      const ssize_t n = ::read(fd, frame + got, sizeof(frame) - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) Die("read handshake frame");
      got += static_cast<size_t>(n);
    }
    std::fprintf(stdout, "token ");
    for (int i = 0; i < 16; ++i) std::fprintf(stdout, "%02x", frame[i]);
    Say("");
  } else {
    Say("connected");
  }
  char line[4096];
  while (Command(line, sizeof(line))) {
    if (std::strncmp(line, "exec ", 5) == 0) {
      char address_arg[32], bytes_arg[32];
      std::snprintf(address_arg, sizeof(address_arg), "%llu",
                    static_cast<unsigned long long>(address));
      std::snprintf(bytes_arg, sizeof(bytes_arg), "%llu",
                    static_cast<unsigned long long>(bytes));
      char* const args[] = {line + 5, const_cast<char*>("image"), address_arg,
                            bytes_arg, nullptr};
      ::execv(line + 5, args);
      Die("execv");
    } else if (std::strncmp(line, "setuid ", 7) == 0) {
      const auto id = static_cast<uid_t>(std::atol(line + 7));
      if (::setresuid(id, id, id) != 0) Die("setresuid");
      Say("ok");
    } else if (std::strcmp(line, "dumpable") == 0) {
      if (::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) Die("PR_SET_DUMPABLE");
      Say("ok");
    } else if (std::strcmp(line, "check") == 0) {
      Say(Holds(data, bytes, TrainerByte) ? "trainer" : "changed");
    } else if (std::strcmp(line, "exit") == 0) {
      return 0;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && std::strcmp(argv[1], "trainer") == 0) {
    return Trainer(argv[2], std::strtoull(argv[3], nullptr, 10),
                   std::strtoull(argv[4], nullptr, 10), argc - 5, argv + 5);
  }
  if (argc == 4 && std::strcmp(argv[1], "image") == 0) {
    return Image(std::strtoull(argv[2], nullptr, 10),
                 std::strtoull(argv[3], nullptr, 10));
  }
  std::fprintf(stderr, "usage: see tests/session/binding_probe_main.cc\n");
  return 2;
}
