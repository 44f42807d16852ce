/* The four ggml symbols ggml-quants.c needs, so its quantizers and the CPU backend's generic
   dot products link alone into a test library. */
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include "ggml.h"
#define GGML_COMMON_DECL_C
#include "ggml-common.h"
void ggml_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt); fprintf(stderr, "%s:%d: ", file, line);
    vfprintf(stderr, fmt, ap); va_end(ap); abort();
}
static const int BLCK[] = {[GGML_TYPE_Q4_0]=32,[GGML_TYPE_Q4_1]=32,[GGML_TYPE_Q5_0]=32,[GGML_TYPE_Q5_1]=32,
 [GGML_TYPE_Q8_0]=32,[GGML_TYPE_Q8_1]=32,[GGML_TYPE_Q2_K]=256,[GGML_TYPE_Q3_K]=256,[GGML_TYPE_Q4_K]=256,
 [GGML_TYPE_Q5_K]=256,[GGML_TYPE_Q6_K]=256,[GGML_TYPE_Q8_K]=256,[GGML_TYPE_IQ2_XXS]=256,[GGML_TYPE_IQ2_XS]=256,
 [GGML_TYPE_IQ3_XXS]=256,[GGML_TYPE_IQ1_S]=256,[GGML_TYPE_IQ4_NL]=32,[GGML_TYPE_IQ3_S]=256,[GGML_TYPE_IQ2_S]=256,
 [GGML_TYPE_IQ4_XS]=256,[GGML_TYPE_IQ1_M]=256,[GGML_TYPE_TQ1_0]=256,[GGML_TYPE_TQ2_0]=256,[GGML_TYPE_MXFP4]=32};
static const size_t SIZE[] = {[GGML_TYPE_Q4_0]=sizeof(block_q4_0),[GGML_TYPE_Q4_1]=sizeof(block_q4_1),
 [GGML_TYPE_Q5_0]=sizeof(block_q5_0),[GGML_TYPE_Q5_1]=sizeof(block_q5_1),[GGML_TYPE_Q8_0]=sizeof(block_q8_0),
 [GGML_TYPE_Q8_1]=sizeof(block_q8_1),[GGML_TYPE_Q2_K]=sizeof(block_q2_K),[GGML_TYPE_Q3_K]=sizeof(block_q3_K),
 [GGML_TYPE_Q4_K]=sizeof(block_q4_K),[GGML_TYPE_Q5_K]=sizeof(block_q5_K),[GGML_TYPE_Q6_K]=sizeof(block_q6_K),
 [GGML_TYPE_Q8_K]=sizeof(block_q8_K),[GGML_TYPE_IQ2_XXS]=sizeof(block_iq2_xxs),[GGML_TYPE_IQ2_XS]=sizeof(block_iq2_xs),
 [GGML_TYPE_IQ3_XXS]=sizeof(block_iq3_xxs),[GGML_TYPE_IQ1_S]=sizeof(block_iq1_s),[GGML_TYPE_IQ4_NL]=sizeof(block_iq4_nl),
 [GGML_TYPE_IQ3_S]=sizeof(block_iq3_s),[GGML_TYPE_IQ2_S]=sizeof(block_iq2_s),[GGML_TYPE_IQ4_XS]=sizeof(block_iq4_xs),
 [GGML_TYPE_IQ1_M]=sizeof(block_iq1_m),[GGML_TYPE_TQ1_0]=sizeof(block_tq1_0),[GGML_TYPE_TQ2_0]=sizeof(block_tq2_0),
 [GGML_TYPE_MXFP4]=sizeof(block_mxfp4)};
size_t ggml_type_size(enum ggml_type t) { return SIZE[t]; }
int64_t ggml_blck_size(enum ggml_type t) { return BLCK[t]; }
size_t ggml_row_size(enum ggml_type t, int64_t ne) { return SIZE[t] * ne / BLCK[t]; }
const char *ggml_type_name(enum ggml_type t) { (void)t; return "?"; }
#include <string.h>
#include <math.h>
/* The CPU backend's f16 table, filled at load with the exact widening. */
float ggml_table_f32_f16[1 << 16];
static float f16_bits_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);
    else if (exp == 31) { uint32_t b = sign | 0x7f800000 | (man << 13); memcpy(&v, &b, 4); return v; }
    else v = ldexpf((float)(man | 0x400), (int)exp - 25);
    return sign ? -v : v;
}
__attribute__((constructor)) static void fill_table(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) ggml_table_f32_f16[i] = f16_bits_to_f32((uint16_t)i);
}
