/* C transcription of hwgen.ibert.golden.isqrt, used by tests/test_ibert_isqrt.py.
 *
 *   isqrt_check all LO HI   checks r*r <= v < (r+1)*(r+1) for every v in [LO * 2**16, HI * 2**16)
 *                           and prints "<failures> <first failing v or 0>"; exit status 1 on a
 *                           failure.
 *   isqrt_check roots       reads decimal values below 2**32 from stdin, prints their roots.
 *
 * The steps are those of the golden model: for j = 15 .. 0, sub = (4 * root + 1) << 2j, take
 * the digit if rem >= sub. The golden model holds rem and root in int64; 32-bit unsigned
 * arithmetic is exact here: rem <= v < 2**32 and, since root < 2**(15 - j) before digit j,
 * sub < 2**(17 - j) * 2**(2j) = 2**(17 + j) <= 2**32 (and the shifted-out bits are zero). The
 * check avoids (r + 1)**2 = 2**32: v < (r+1)**2 <=> v - r*r <= 2r given r*r <= v; r <= 0xFFFF
 * keeps r*r from wrapping.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline uint32_t isqrt_steps(uint32_t v)
{
    uint32_t rem = v, root = 0;
    for (int j = 15; j >= 0; j--) {
        uint32_t sub = ((root << 2) + 1) << (2 * j);
        uint32_t take = rem >= sub;
        rem -= take ? sub : 0;
        root = (root << 1) + take;
    }
    return root;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "roots")) {
        unsigned long long v;
        while (scanf("%llu", &v) == 1) {
            if (v >> 32) {
                fprintf(stderr, "value %llu is not below 2**32\n", v);
                return 2;
            }
            printf("%u\n", isqrt_steps((uint32_t)v));
        }
        return 0;
    }
    if (argc != 4 || strcmp(argv[1], "all")) {
        fprintf(stderr, "usage: %s all LO HI | %s roots\n", argv[0], argv[0]);
        return 2;
    }
    uint64_t lo = strtoull(argv[2], NULL, 0), hi = strtoull(argv[3], NULL, 0);
    if (hi > (1u << 16) || lo > hi) {
        fprintf(stderr, "need 0 <= LO <= HI <= 65536\n");
        return 2;
    }
    uint64_t bad = 0, first = 0;
    for (uint64_t top = lo; top < hi; top++) {
        uint32_t nbad = 0;
        for (uint32_t low = 0; low < (1u << 16); low++) {      /* vectorisable inner loop */
            uint32_t v = (uint32_t)(top << 16) | low;
            uint32_t r = isqrt_steps(v);
            uint32_t sq = r * r;
            nbad += !(r <= 0xFFFF && sq <= v && v - sq <= 2 * r);
        }
        if (nbad && !bad) {
            for (uint32_t low = 0; low < (1u << 16); low++) {
                uint32_t v = (uint32_t)(top << 16) | low, r = isqrt_steps(v), sq = r * r;
                if (!(r <= 0xFFFF && sq <= v && v - sq <= 2 * r)) {
                    first = v;
                    break;
                }
            }
        }
        bad += nbad;
    }
    printf("%llu %llu\n", (unsigned long long)bad, (unsigned long long)first);
    return bad != 0;
}
