/* check.h - tiny assertion helpers for the C workloads (exit 1 with the location). */
#ifndef VRAMSHIM_CHECK_H
#define VRAMSHIM_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include "cuda_api.h"

/* A runtime call must return cudaSuccess. */
#define CK(call)                                                                               \
    do {                                                                                       \
        cudaError_t ck_e_ = (call);                                                            \
        if (ck_e_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d: %s -> %d (%s)\n", __FILE__, __LINE__, #call, (int)ck_e_,   \
                    cudaGetErrorName(ck_e_));                                                  \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

/* A call (runtime or driver) must return exactly `want`. */
#define EXPECT_EQ(call, want)                                                                  \
    do {                                                                                       \
        long long eq_got_ = (long long)(call), eq_want_ = (long long)(want);                   \
        if (eq_got_ != eq_want_) {                                                             \
            fprintf(stderr, "%s:%d: %s -> %lld, expected %lld\n", __FILE__, __LINE__, #call,   \
                    eq_got_, eq_want_);                                                        \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);                \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#endif
