/*
 * sandbox-agent launcher: the first few kilobytes of the static sandbox-agent binary.
 *
 * Why it exists: the payload appended to this file is a staticx bundle (a PyInstaller onefile
 * program plus its libc), and both layers unpack themselves into $TMPDIR (default /tmp) and
 * execute from there. The agent must start in any image, including one with no /tmp at all or
 * a noexec /tmp, so this launcher picks a directory that is writable and allows exec, creating
 * /tmp if nothing suitable exists, exports it as TMPDIR, writes the payload there and execs
 * it (staticx needs a real path behind /proc/self/exe, so memfd_create cannot be used). PID and
 * argv are kept, so the agent can run as the container's PID 1. The agent deletes the payload
 * file once it runs (env SANDBOX_AGENT_LAUNCHER_PAYLOAD) and restores the caller's TMPDIR
 * (env SANDBOX_AGENT_TMPDIR_ORIG), so commands it starts see the environment it was given.
 *
 * Directory order: $TMPDIR, /tmp, /dev/shm, /run, /var/tmp, then /tmp created with mode 1777,
 * then /.sandbox-agent-tmp.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define MAGIC "SAGENT01"
extern char **environ;

static int usable(const char *dir)
{
    struct statvfs vfs;
    struct stat st;
    if (dir == NULL || dir[0] != '/' || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return 0;
    if (statvfs(dir, &vfs) != 0 || (vfs.f_flag & (ST_NOEXEC | ST_RDONLY)))
        return 0;
    return access(dir, W_OK | X_OK) == 0;
}

static const char *pick_dir(void)
{
    const char *candidates[] = {getenv("TMPDIR"), "/tmp", "/dev/shm", "/run", "/var/tmp"};
    for (size_t i = 0; i < sizeof(candidates) / sizeof(candidates[0]); i++)
        if (usable(candidates[i]))
            return candidates[i];
    if (mkdir("/tmp", 01777) == 0) {
        chmod("/tmp", 01777);
        if (usable("/tmp"))
            return "/tmp";
    }
    if ((mkdir("/.sandbox-agent-tmp", 0700) == 0 || errno == EEXIST) &&
        usable("/.sandbox-agent-tmp"))
        return "/.sandbox-agent-tmp";
    return NULL;
}

static int copy_range(int in, int out, off_t offset, uint64_t size)
{
    char buf[1 << 16];
    while (size > 0) {
        size_t want = size < sizeof(buf) ? (size_t)size : sizeof(buf);
        ssize_t got = pread(in, buf, want, offset);
        if (got <= 0)
            return -1;
        for (ssize_t done = 0; done < got;) {
            ssize_t n = write(out, buf + done, (size_t)(got - done));
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                return -1;
            }
            done += n;
        }
        offset += got;
        size -= (uint64_t)got;
    }
    return 0;
}

int main(int argc, char **argv)
{
    (void)argc;
    const char *dir = pick_dir();
    if (dir == NULL) {
        fprintf(stderr, "sandbox-agent: no writable, exec-able directory found "
                        "($TMPDIR, /tmp, /dev/shm, /run, /var/tmp) and / is read-only; "
                        "mount a tmpfs at /tmp or set TMPDIR\n");
        return 2;
    }
    const char *orig_tmpdir = getenv("TMPDIR");
    if (orig_tmpdir != NULL)
        setenv("SANDBOX_AGENT_TMPDIR_ORIG", orig_tmpdir, 1);
    setenv("TMPDIR", dir, 1);

    int self = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (self < 0) {
        perror("sandbox-agent: open /proc/self/exe (is /proc mounted?)");
        return 2;
    }
    struct stat st;
    char trailer[16];
    if (fstat(self, &st) != 0 || st.st_size < 16 ||
        pread(self, trailer, 16, st.st_size - 16) != 16 || memcmp(trailer + 8, MAGIC, 8) != 0) {
        fprintf(stderr, "sandbox-agent: payload missing; rebuild with agent/build/build-static.sh\n");
        return 2;
    }
    uint64_t size;
    memcpy(&size, trailer, 8);
    off_t start = st.st_size - 16 - (off_t)size;

    char path[4096];
    snprintf(path, sizeof(path), "%s/sandbox-agent-XXXXXX", dir);
    int fd = mkostemp(path, O_CLOEXEC);
    if (fd < 0 || copy_range(self, fd, start, size) != 0 || fchmod(fd, 0700) != 0) {
        perror("sandbox-agent: writing the payload");
        return 2;
    }
    close(fd);
    setenv("SANDBOX_AGENT_LAUNCHER_PAYLOAD", path, 1);
    execv(path, argv);
    perror("sandbox-agent: exec");
    return 2;
}
