// Runs a whole llama.cpp model (libllama, statically linked) the way a chat program does: one llama_decode
// of PREFILL tokens, then DECODE single-token llama_decode calls, each wrapped in the counting plugin's
// markers (imegen_bench_begin/end), so every call is one counted region. llama_synchronize lies inside
// the region: the call's whole work, nothing of the driver's logits handling.
//
//   whole_driver [--per-node] MODEL THREADS PREFILL DECODE [LOGITS_OUT]
//
// --per-node splits each call into a region per ggml node, through llama.cpp's graph-eval callback
// (llama_context_params.cb_eval): ggml's scheduler then asks, node by node, whether the node is observed;
// an observed node is computed as a graph of its own (with the unobserved nodes just before it) and the
// callback runs again once it is done. Every node that computes something is observed, except RMS_NORM,
// which is left to be computed with the MUL after it (ggml-cpu fuses RMS_NORM + MUL when both are in one
// graph; observing the norm alone would unfuse them); views, reshapes and permutes compute nothing and go
// with the node after them. Regions: "gap" (from the previous node's end, or the call's start, to the
// next node's start: llama.cpp's graph building and inputs before the first node, the scheduler's loop
// between nodes), "node ..." (one node, described on its line), and the call's tail up to
// llama_synchronize's end (its "call" line). The callback's own code is the driver's (not counted), and
// what it prints lies between one region's end and the next one's begin: uncounted too.
//
// Token ids are fixed (a stride through the vocabulary), and each decode step feeds the previous step's
// argmax, as greedy generation does. Without LOGITS_OUT only each call's last position is an output
// (llama.cpp's default: the last layer's FFN and the lm_head then run on that row only). With LOGITS_OUT
// every position is an output and all logits are written there (float32, positions x n_vocab) to be
// checked against an independent model.
//
// imegen's IME emulator (runtime/ime_emu.c) is installed first: under QEMU every vmadot traps into it.
// Prints "n_vocab N", "n_layer N", one "call TOKENS POSITION EMULATED" line per llama_decode (EMULATED:
// vmadot the emulator ran in that call), and "argmax I" per output; with --per-node also one "gap" or
// "node OP TENSOR..." line per region before each call's "call" line. A node line's tensors are its
// output, then its inputs, each NAME:TYPE:TYPE_SIZE:BLOCK:NE0,NE1,NE2,NE3:NBYTES:FLAGS (FLAGS: w for a
// tensor in the model's weight buffers, v for a view, - for neither); a FLASH_ATTN_EXT node ends with
// "kv N": the KV cells its mask lets at least one of its queries attend (the rows of K and V it reads).
#include <cmath>
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

static bool computes_nothing(const ggml_tensor *t)
{
    // ggml-cpu skips these (ggml_op_is_empty) and nodes the graph does not mark for computing.
    switch (t->op) {
    case GGML_OP_NONE:
    case GGML_OP_RESHAPE:
    case GGML_OP_TRANSPOSE:
    case GGML_OP_VIEW:
    case GGML_OP_PERMUTE:
        return true;
    default:
        return (t->flags & GGML_TENSOR_FLAG_COMPUTE) == 0;
    }
}

static void print_tensor(const ggml_tensor *t)
{
    char name[GGML_MAX_NAME];
    int i = 0;
    for (; t->name[i] && i < GGML_MAX_NAME - 1; i++)  // "cache_k_l0 (view)": no blanks in a field
        name[i] = (t->name[i] == ' ' || t->name[i] == ':') ? '_' : t->name[i];
    name[i] = 0;
    const bool weight = t->buffer && ggml_backend_buffer_get_usage(t->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
    printf(" %s:%s:%zu:%lld:%lld,%lld,%lld,%lld:%zu:%s", name[0] ? name : "-", ggml_type_name(t->type),
           ggml_type_size(t->type), (long long)ggml_blck_size(t->type), (long long)t->ne[0], (long long)t->ne[1],
           (long long)t->ne[2], (long long)t->ne[3], ggml_nbytes(t), weight ? "w" : t->view_src ? "v" : "-");
}

// KV cells of a FLASH_ATTN_EXT node's mask (src[3], f16, one row per query) that some query may attend:
// ggml's CPU flash attention skips a cell whose mask is -inf without reading its K or V row.
static long attended_cells(const ggml_tensor *fa)
{
    const ggml_tensor *mask = fa->src[3];
    if (!mask)
        return fa->src[1]->ne[1];
    long cells = 0;
    for (int64_t j = 0; j < mask->ne[0]; j++) {
        bool open = false;
        for (int64_t q = 0; q < fa->src[0]->ne[1] && !open; q++)
            for (int64_t h = 0; h < mask->ne[2] && !open; h++) {
                const char *row = (const char *)mask->data + q * mask->nb[1] + h * mask->nb[2];
                open = ggml_fp16_to_fp32(((const ggml_fp16_t *)row)[j]) != -INFINITY;
            }
        cells += open;
    }
    return cells;
}

static const ggml_tensor *pending_norm;  // an RMS_NORM left to be computed with the next observed node

static void print_node(const ggml_tensor *t)
{
    const ggml_tensor *norm = pending_norm;
    pending_norm = nullptr;
    const bool fused = norm && t->op == GGML_OP_MUL && (t->src[0] == norm || t->src[1] == norm);
    printf("node %s%s", norm ? (fused ? "RMS_NORM+" : "RMS_NORM,") : "", ggml_op_desc(t));
    print_tensor(t);
    if (norm)  // the pair reads the norm's input and the MUL's other operand; the norm's output is not stored
        print_tensor(norm->src[0]);
    for (int i = 0; i < GGML_MAX_SRC && t->src[i]; i++)
        if (!fused || t->src[i] != norm)
            print_tensor(t->src[i]);
    if (t->op == GGML_OP_FLASH_ATTN_EXT)
        printf(" kv %ld", attended_cells(t));
    printf("\n");
}

// ggml_backend_sched_eval_callback: ask = true before a node (the answer: observe it), false after an
// observed node is computed (the answer: go on). Each boundary ends one counted region and begins the next.
static bool node_boundary(ggml_tensor *t, bool ask, void *)
{
    if (ask && (computes_nothing(t) || t->op == GGML_OP_RMS_NORM)) {
        if (t->op == GGML_OP_RMS_NORM)
            pending_norm = t;
        return false;
    }
    imegen_bench_end();
    if (ask)
        printf("gap\n");
    else
        print_node(t);
    imegen_bench_begin();
    return true;
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
    const bool per_node = argc > 1 && strcmp(argv[1], "--per-node") == 0;
    if (per_node)
        argc--, argv++;
    if (argc != 5 && argc != 6)
        return fail("usage: whole_driver [--per-node] MODEL THREADS PREFILL DECODE [LOGITS_OUT]");
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
    if (per_node)
        cp.cb_eval = node_boundary;
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
