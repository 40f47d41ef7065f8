/* vs.h - read vramshim's in-process counters from a test program.
 *
 * Under LD_PRELOAD=libvramshim.so, `vramshim_counter` is found with dlsym(RTLD_DEFAULT);
 * without the preload it is absent and every EXPECT_VS is skipped, so the same program runs
 * both ways and its stdout can be compared. Checks print to stderr and exit(3). */
#ifndef VRAMSHIM_VS_H
#define VRAMSHIM_VS_H
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef long long (*vs_counter_fn)(const char *);
static vs_counter_fn vs_fn;

/* Returns 1 when running under the preload. */
static inline int vs_init(void) {
    vs_fn = (vs_counter_fn)dlsym(RTLD_DEFAULT, "vramshim_counter");
    return vs_fn != NULL;
}

/* The counter's value, or -2 without the preload. */
static inline long long VS(const char *name) { return vs_fn ? vs_fn(name) : -2; }

#define EXPECT_VS(name, want)                                                                  \
    do {                                                                                       \
        if (vs_fn) {                                                                           \
            long long vs_g_ = vs_fn(name), vs_w_ = (long long)(want);                          \
            if (vs_g_ != vs_w_) {                                                              \
                fprintf(stderr, "%s:%d: counter %s = %lld, expected %lld\n", __FILE__,         \
                        __LINE__, name, vs_g_, vs_w_);                                         \
                exit(3);                                                                       \
            }                                                                                  \
        }                                                                                      \
    } while (0)

#define EXPECT_VS_GE(name, want)                                                               \
    do {                                                                                       \
        if (vs_fn) {                                                                           \
            long long vs_g_ = vs_fn(name), vs_w_ = (long long)(want);                          \
            if (vs_g_ < vs_w_) {                                                               \
                fprintf(stderr, "%s:%d: counter %s = %lld, expected >= %lld\n", __FILE__,      \
                        __LINE__, name, vs_g_, vs_w_);                                         \
                exit(3);                                                                       \
            }                                                                                  \
        }                                                                                      \
    } while (0)
#endif
