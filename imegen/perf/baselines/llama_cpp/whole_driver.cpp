// Runs a whole llama.cpp model (libllama, statically linked) the way a chat program does: one llama_decode
// of PREFILL tokens, then DECODE single-token llama_decode calls, each wrapped in the counting plugin's
// markers (imegen_bench_begin/end), so every call is one counted region. llama_synchronize lies inside
// the region: the call's whole work, nothing of the driver's logits handling.
//
//   whole_driver MODEL THREADS PREFILL DECODE [LOGITS_OUT]
//
// Token ids are fixed (a stride through the vocabulary), and each decode step feeds the previous step's
// argmax, as greedy generation does. Without LOGITS_OUT only each call's last position is an output
// (llama.cpp's default: the last layer's FFN and the lm_head then run on that row only). With LOGITS_OUT
// every position is an output and all logits are written there (float32, positions x n_vocab) to be
// checked against an independent model.
//
// imegen's IME emulator (runtime/ime_emu.c) is installed first: under QEMU every vmadot traps into it.
// Prints "n_vocab N", "n_layer N", one "call TOKENS POSITION EMULATED" line per llama_decode (EMULATED:
// vmadot the emulator ran in that call), and "argmax I" per output.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "bench_markers.h"  // the plugin finds the markers by their C names
}
#include "ime_emu.h"
#include "llama.h"

static void quiet_log(ggml_log_level level, const char *text, void *)
{
    // llama.cpp's info chatter goes to stderr only when asked: the caller parses stdout.
    static const bool verbose = getenv("IMEGEN_LLAMA_VERBOSE") != nullptr;
    if (verbose || level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

static int fail(const char *what)
{
    fprintf(stderr, "whole_driver: %s\n", what);
    return 1;
}

static int argmax(const float *row, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

// One llama_decode of `tokens` at positions start.., outputs as asked; returns its status.
static int counted_decode(llama_context *ctx, const std::vector<llama_token> &tokens, int start, bool all_outputs)
{
    const int n = (int)tokens.size();
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = start + i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = all_outputs || i == n - 1;
    }
    batch.n_tokens = n;
    const unsigned long emulated = imegen_ime_emu_count();
    imegen_bench_begin();
    int status = llama_decode(ctx, batch);
    llama_synchronize(ctx);
    imegen_bench_end();
    llama_batch_free(batch);
    printf("call %d %d %lu\n", n, start, imegen_ime_emu_count() - emulated);
    return status;
}

int main(int argc, char **argv)
{
    if (argc != 5 && argc != 6)
        return fail("usage: whole_driver MODEL THREADS PREFILL DECODE [LOGITS_OUT]");
    const int threads = atoi(argv[2]), prefill = atoi(argv[3]), decode = atoi(argv[4]);
    const char *logits_path = argc == 6 ? argv[5] : nullptr;
    if (threads < 1 || prefill < 1 || decode < 0)
        return fail("THREADS and PREFILL must be >= 1, DECODE >= 0");

    imegen_ime_emu_install();
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model)
        return fail("cannot load the model");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(prefill + decode + 1);
    cp.n_batch = cp.n_ubatch = (uint32_t)prefill;  // the prefill is one physical batch
    cp.n_threads = cp.n_threads_batch = threads;
    cp.no_perf = true;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx)
        return fail("cannot create the context");
    printf("n_vocab %d\nn_layer %d\n", n_vocab, llama_model_n_layer(model));

    FILE *out = logits_path ? fopen(logits_path, "wb") : nullptr;
    if (logits_path && !out)
        return fail("cannot open the logits file");
    std::vector<llama_token> tokens(prefill);
    for (int i = 0; i < prefill; i++)
        tokens[i] = (llama_token)((13 + 7919LL * i) % n_vocab);
    int pos = 0;
    for (int step = 0; step <= decode; step++) {
        if (counted_decode(ctx, tokens, pos, out != nullptr) != 0)
            return fail("llama_decode failed");
        const int outputs = out ? (int)tokens.size() : 1;
        int last = 0;
        for (int i = 0; i < outputs; i++) {
            const float *row = llama_get_logits_ith(ctx, out ? i : -1);
            if (!row)
                return fail("no logits");
            if (out && fwrite(row, sizeof(float), (size_t)n_vocab, out) != (size_t)n_vocab)
                return fail("cannot write the logits");
            last = argmax(row, n_vocab);
            printf("argmax %d\n", last);
        }
        pos += (int)tokens.size();
        tokens.assign(1, (llama_token)last);
    }
    if (out && fclose(out) != 0)
        return fail("cannot write the logits");
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
