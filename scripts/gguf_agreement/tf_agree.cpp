// llama.cpp's teacher-forced top-1 agreement with an oracle, on a GGUF: the figure `colibri
// validate` reports as `tf=a/b`, computed by llama.cpp itself (its loader, its kernels, its
// graph for the file's architecture) so the two engines are measured on the same file and the
// same tokens.
//
//   tf_agree MODEL.gguf < IDS        IDS: one case a line, "full_ids ... | tf_pred ..."
//
// For every line: one llama_decode over full_ids with every position's logits kept, the argmax
// at each position compared with tf_pred (ties go to the lowest id, as validate's do). Prints
// "matched/total" a line. The whole sequence is one batch, so nothing depends on a KV cache.
#include "llama.h"

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

static void quiet(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf < IDS\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    // No extra buffer types (weight repacking, AMX): on this machine (AVX-512 + AMX) the AMX
    // buffer's ggml_backend_amx_mul_mat segfaults on the Q4_K/Q5_K/Q6_K/IQ4_XS matrices of these
    // small models; without it llama.cpp computes with its ordinary CPU dot products, the
    // same numerics as on a machine without AMX.
    mp.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "%s: llama.cpp could not load it\n", argv[1]);
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::vector<llama_token> full, want;
        std::string w;
        bool second = false;
        while (in >> w) {
            if (w == "|") {
                second = true;
            } else {
                (second ? want : full).push_back(std::stoi(w));
            }
        }
        if (full.empty() || full.size() != want.size()) {
            fprintf(stderr, "a case needs as many tf_pred as full_ids\n");
            return 2;
        }
        const int n = (int) full.size();
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = n;
        cp.n_batch = n;
        cp.n_ubatch = n;
        cp.n_threads = cp.n_threads_batch = 2;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            fprintf(stderr, "no context\n");
            return 1;
        }
        llama_batch batch = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            batch.token[i] = full[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_decode failed\n");
            return 1;
        }
        int matched = 0;
        for (int i = 0; i < n; i++) {
            const float * l = llama_get_logits_ith(ctx, i);
            int best = 0;
            for (int t = 1; t < n_vocab; t++) {
                if (l[t] > l[best]) {
                    best = t;
                }
            }
            matched += best == want[i];
        }
        printf("%d/%d\n", matched, n);
        llama_batch_free(batch);
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}
