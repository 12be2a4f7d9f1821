/* A power cut, simulated for SQLite (tests/powercut/__init__.py): preloaded into a
 * process, this shim logs every write, truncate, sync and unlink of files under
 * $AJ_POWERCUT_DIR to $AJ_POWERCUT_LOG, after the real call succeeded. From that log
 * the tests rebuild each file as the disk held it at its last sync: what a machine
 * that lost power would find, if none of the unsynced writes had reached the disk.
 *
 * Record: op (1 byte: W write, T truncate, S sync, U unlink), path length (u16),
 * offset or length (i64), data length (u32), path, data.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int logfd = -1;
static const char *prefix;
static size_t prefix_len;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off64_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_ftruncate64)(int, off64_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_unlink)(const char *);

__attribute__((constructor)) static void init(void) {
    real_write = dlsym(RTLD_NEXT, "write");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_pwrite64 = dlsym(RTLD_NEXT, "pwrite64");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_ftruncate64 = dlsym(RTLD_NEXT, "ftruncate64");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    const char *log = getenv("AJ_POWERCUT_LOG");
    prefix = getenv("AJ_POWERCUT_DIR");
    if (log && prefix) {
        logfd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        prefix_len = strlen(prefix);
    }
}

static int watched(const char *path) {
    return logfd >= 0 && strncmp(path, prefix, prefix_len) == 0;
}

static int path_of(int fd, char *buf, size_t size) {
    char link[64];
    if (fd == logfd) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, buf, size - 1);
    if (n <= 0) return 0;
    buf[n] = 0;
    return watched(buf);
}

static void record(char op, const char *path, int64_t at, const void *data, uint32_t len) {
    uint16_t plen = (uint16_t)strlen(path);
    char head[1 + 2 + 8 + 4];
    head[0] = op;
    memcpy(head + 1, &plen, 2);
    memcpy(head + 3, &at, 8);
    memcpy(head + 11, &len, 4);
    struct iovec parts[3] = {{head, sizeof head}, {(void *)path, plen}, {(void *)data, len}};
    pthread_mutex_lock(&mu);
    real_writev(logfd, parts, 3);  /* O_APPEND: one record, whole */
    pthread_mutex_unlock(&mu);
}

static void wrote(int fd, const void *buf, ssize_t n, int64_t at) {
    char path[4096];
    if (n > 0 && path_of(fd, path, sizeof path)) record('W', path, at, buf, (uint32_t)n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) {
    ssize_t r = real_pwrite(fd, buf, n, at);
    wrote(fd, buf, r, at);
    return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t at) {
    ssize_t r = real_pwrite64(fd, buf, n, at);
    wrote(fd, buf, r, at);
    return r;
}

ssize_t write(int fd, const void *buf, size_t n) {
    char path[4096];
    if (!path_of(fd, path, sizeof path)) return real_write(fd, buf, n);
    off_t at = lseek(fd, 0, SEEK_CUR);
    ssize_t r = real_write(fd, buf, n);
    if (r > 0) record('W', path, at, buf, (uint32_t)r);
    return r;
}

static void truncated(int fd, int r, int64_t length) {
    char path[4096];
    if (r == 0 && path_of(fd, path, sizeof path)) record('T', path, length, "", 0);
}

int ftruncate(int fd, off_t length) {
    int r = real_ftruncate(fd, length);
    truncated(fd, r, length);
    return r;
}

int ftruncate64(int fd, off64_t length) {
    int r = real_ftruncate64(fd, length);
    truncated(fd, r, length);
    return r;
}

static void synced(int fd, int r) {
    char path[4096];
    if (r == 0 && path_of(fd, path, sizeof path)) record('S', path, 0, "", 0);
}

int fsync(int fd) {
    int r = real_fsync(fd);
    synced(fd, r);
    return r;
}

int fdatasync(int fd) {
    int r = real_fdatasync(fd);
    synced(fd, r);
    return r;
}

int unlink(const char *path) {
    int r = real_unlink(path);
    if (r == 0 && watched(path)) record('U', path, 0, "", 0);
    return r;
}
