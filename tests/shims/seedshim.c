/*
 * A bench-only LD_PRELOAD library that gives every redis-server the same
 * random seed: its hash tables (the keyspace, the command table) then lay
 * out the same keys the same way in every run, so instruction counts under
 * callgrind repeat. Without it each server draws its SipHash seed from
 * /dev/urandom, and how long a bucket chain a lookup walks (the command
 * table's for every request) moves the count of a whole run by a few percent.
 *
 * Only fopen("/dev/urandom") (and fopen64) is changed, which Redis (getRandomBytes) and
 * Valkey call once at start-up: it reads 64 fixed bytes. Every other fopen
 * is the C library's. And getrandom(), where the module's Rust standard
 * library draws the keys of its hash maps (`RandomState`, and with it the
 * module's keyed hash, lock_core::hash): the same bytes every run, so its
 * maps' probe lengths repeat too (a bound grant's count moved by up to 3%
 * between runs of one build without it). Nothing here runs while a request
 * is measured.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

static char seed[64] = "redis-lock bench: one seed for every server and every run.....";

typedef FILE *(*fopen_fn)(const char *, const char *);

static FILE *open_file(const char *name, fopen_fn *real, const char *path, const char *mode) {
    if (path != NULL && strcmp(path, "/dev/urandom") == 0)
        return fmemopen(seed, sizeof seed, "r");
    if (*real == NULL)
        *real = (fopen_fn)dlsym(RTLD_NEXT, name);
    return *real == NULL ? NULL : (*real)(path, mode);
}

FILE *fopen(const char *path, const char *mode) {
    static fopen_fn real;
    return open_file("fopen", &real, path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
    static fopen_fn real;
    return open_file("fopen64", &real, path, mode);
}

ssize_t getrandom(void *buf, size_t len, unsigned int flags) {
    (void)flags;
    unsigned char *out = buf;
    for (size_t i = 0; i < len; i++)
        out[i] = (unsigned char)seed[i % (sizeof seed - 1)];
    return (ssize_t)len;
}
