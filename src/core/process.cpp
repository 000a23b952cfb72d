#include "process.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

namespace affinity {

namespace {

constexpr int64_t kUnreadable = -1;    // no /proc entry: ask kill()
constexpr int64_t kExited = -2;        // a zombie: exited, not collected

// /proc/PID/stat: "pid (comm) state ppid ...", starttime is field 22.  The
// command name may hold spaces and parentheses: fields are counted after
// the last ')'.  0 if it cannot be parsed.
int64_t read_start(uint64_t pid) noexcept
{
    char path[64];
    char buf[1024];

    std::snprintf(path, sizeof(path), "/proc/%llu/stat",
                  static_cast<unsigned long long>(pid));

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return kUnreadable;
    }

    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);

    if (n <= 0) {
        return kUnreadable;
    }

    buf[n] = '\0';

    const char *p = std::strrchr(buf, ')');
    if (p == nullptr || p[1] == '\0') {
        return 0;
    }

    // A zombie has exited: its parent has not collected it yet.
    if (p[2] == 'Z' || p[2] == 'X') {
        return kExited;
    }

    // After ')': field 3 (state) onwards; starttime is the 20th of those.
    for (int field = 2; field < 22 && p; field++) {
        p = std::strchr(p + 1, ' ');
    }

    if (p == nullptr) {
        return 0;
    }

    char *end;
    unsigned long long start = std::strtoull(p + 1, &end, 10);

    return end == p + 1 ? 0 : static_cast<int64_t>(start);
}

}  // namespace

uint64_t process_start(uint64_t pid) noexcept
{
    int64_t start = read_start(pid);
    return start > 0 ? static_cast<uint64_t>(start) : 0;
}

bool process_alive(uint64_t pid, uint64_t start) noexcept
{
    if (pid == 0 || pid > uint64_t(INT32_MAX)) {
        return false;
    }

    int64_t now = read_start(pid);

    if (now == kExited) {
        return false;
    }

    if (now > 0 && start != 0) {
        return static_cast<uint64_t>(now) == start;
    }

    if (now >= 0) {
        return true;
    }

    // No /proc: a process that is gone is told by kill(); one that took
    // the pid over is not (another user's answers EPERM).
    return kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

}  // namespace affinity
