// logits: the llama.cpp oracle for memra. Loads a GGUF on the CPU, feeds a prompt one token
// per llama_decode call (so every step is a batch-of-1 decode, as memra decodes), then
// greedily decodes, and writes JSON with the prompt, the generated ids, every step's full
// logits (printed with %.9g, which round-trips an f32 exactly) and, for MoE layers, the
// experts llama.cpp selected and their router probabilities before normalization.
//
// Settings are chosen so the reference is plain f32 math where llama.cpp allows it: the KV
// cache is F32, flash attention is off, and weight repacking (extra buffer types) is off, so
// the stock ggml CPU kernels run on the bytes of the file.
//
// usage: logits --model M.gguf --prompt 1,2,3 --generate N --out O.json
//               [--threads T] [--ctx C] [--shape S --dtype D --seed X --sha256 H]
// (the last four only record how the GGUF was made: memra-synth's arguments and the file's
// sha256, so a test can regenerate the same file)

#include "ggml.h"
#include "llama.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace {

struct Args {
    std::string model;
    std::string out;
    std::vector<llama_token> prompt;
    int generate = 40;
    int threads = 2;
    int ctx = 256;
    std::string shape;
    std::string dtype;
    std::string seed;
    std::string sha256;
    std::string generator = "memra-synth";
};

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "logits: %s\n", msg.c_str());
    std::exit(1);
}

std::vector<llama_token> parse_ids(const std::string & s) {
    std::vector<llama_token> ids;
    size_t at = 0;
    while (at < s.size()) {
        size_t end = s.find(',', at);
        if (end == std::string::npos) {
            end = s.size();
        }
        ids.push_back((llama_token) std::stol(s.substr(at, end - at)));
        at = end + 1;
    }
    return ids;
}

Args parse_args(int argc, char ** argv) {
    Args a;
    for (int i = 1; i < argc; i++) {
        std::string k = argv[i];
        if (i + 1 >= argc) {
            die("option " + k + " needs a value");
        }
        std::string v = argv[++i];
        if (k == "--model") a.model = v;
        else if (k == "--out") a.out = v;
        else if (k == "--prompt") a.prompt = parse_ids(v);
        else if (k == "--generate") a.generate = std::stoi(v);
        else if (k == "--threads") a.threads = std::stoi(v);
        else if (k == "--ctx") a.ctx = std::stoi(v);
        else if (k == "--shape") a.shape = v;
        else if (k == "--dtype") a.dtype = v;
        else if (k == "--seed") a.seed = v;
        else if (k == "--sha256") a.sha256 = v;
        else if (k == "--generator") a.generator = v;
        else die("unknown option " + k);
    }
    if (a.model.empty() || a.out.empty() || a.prompt.empty()) {
        die("--model, --out and --prompt are required");
    }
    if (a.generate < 1 || (int) a.prompt.size() + a.generate > a.ctx) {
        die("--generate must be at least 1 and prompt + generate must fit --ctx");
    }
    return a;
}

// What the eval callback collects during one decode call: per MoE layer, the expert ids in
// the order llama.cpp ranked them and the router probabilities of those experts.
struct Moe {
    int n_used = 0;
    std::map<int, std::vector<int32_t>> topk;
    std::map<int, std::vector<float>> weights;
};

// Whether `name` is exactly `prefix` followed by a layer number (views and reshapes of a
// named tensor carry suffixes such as " (reshaped)" and are skipped).
bool has_prefix(const char * name, const char * prefix, int * layer) {
    size_t n = std::strlen(prefix);
    if (std::strncmp(name, prefix, n) != 0 || name[n] == 0) {
        return false;
    }
    for (const char * c = name + n; *c; c++) {
        if (*c < '0' || *c > '9') {
            return false;
        }
    }
    *layer = std::atoi(name + n);
    return true;
}

// The argsort over all experts (its first n_used entries are the selection) and the selected
// router probabilities (before normalization and scale).
bool observe(ggml_tensor * t, bool ask, void * user) {
    int layer = -1;
    bool sort = has_prefix(t->name, "ffn_moe_argsort-", &layer);
    bool prob = has_prefix(t->name, "ffn_moe_weights-", &layer);
    if (ask) {
        return sort || prob;
    }
    auto * moe = (Moe *) user;
    if ((sort ? t->ne[1] : t->ne[2]) != 1) {
        die(std::string("expected one token in ") + t->name);
    }
    if (sort) {
        if (t->type != GGML_TYPE_I32 || t->nb[0] != sizeof(int32_t)) {
            die(std::string("unexpected layout of ") + t->name);
        }
        const auto * d = (const int32_t *) t->data;
        moe->topk[layer].assign(d, d + moe->n_used);
    } else if (prob) {
        if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t) || t->ne[1] != moe->n_used) {
            die(std::string("unexpected layout of ") + t->name);
        }
        const auto * d = (const float *) t->data;
        moe->weights[layer].assign(d, d + moe->n_used);
    }
    return true;
}

void put_floats(FILE * f, const float * v, int n) {
    std::fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (!std::isfinite(v[i])) {
            die("non-finite value in output");
        }
        std::fprintf(f, i ? ",%.9g" : "%.9g", v[i]);
    }
    std::fputc(']', f);
}

template <typename T> void put_ints(FILE * f, const std::vector<T> & v) {
    std::fputc('[', f);
    for (size_t i = 0; i < v.size(); i++) {
        std::fprintf(f, i ? ",%d" : "%d", (int) v[i]);
    }
    std::fputc(']', f);
}

// FNV-1a (64-bit) of a file's bytes: a fingerprint the Rust tests recompute without a
// sha256 implementation, to check that memra-synth still writes the file the oracle read.
uint64_t fnv1a64(const std::string & path) {
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) {
        die("cannot read " + path);
    }
    uint64_t h = 0xcbf29ce484222325ull;
    std::vector<unsigned char> buf(1 << 20);
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
        for (size_t i = 0; i < n; i++) {
            h = (h ^ buf[i]) * 0x100000001b3ull;
        }
    }
    std::fclose(f);
    return h;
}

void silent(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

} // namespace

int main(int argc, char ** argv) {
    Args a = parse_args(argc, argv);
    llama_log_set(silent, nullptr);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(a.model.c_str(), mp);
    if (!model) {
        die("llama.cpp could not load " + a.model);
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    char arch[64] = {0};
    llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch));
    Moe moe;
    {
        char buf[32] = {0};
        std::string key = std::string(arch) + ".expert_used_count";
        if (llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf)) > 0) {
            moe.n_used = std::atoi(buf);
        }
    }

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = a.ctx;
    cp.n_batch = 1;
    cp.n_ubatch = 1;
    cp.n_seq_max = 1;
    cp.n_threads = a.threads;
    cp.n_threads_batch = a.threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.no_perf = true;
    if (moe.n_used > 0) {
        cp.cb_eval = observe;
        cp.cb_eval_user_data = &moe;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        die("llama.cpp could not create a context for " + a.model);
    }

    FILE * f = std::fopen(a.out.c_str(), "w");
    if (!f) {
        die("cannot create " + a.out);
    }
    std::fprintf(f, "{\n\"format\": \"memra-oracle-1\",\n");
    std::fprintf(f, "\"llama_cpp\": {\"commit\": \"0c1e570\", \"source\": "
                    "\"llama-cpp-python==0.3.36 vendor/llama.cpp\", \"backend\": \"cpu\"},\n");
    // memra-synth's models are named by shape; gguf-py's by the project script that writes them
    const std::string command = a.generator == "gguf-py"
        ? "scripts/oracle/gguf-py-models.sh DIR " + a.seed + " (writes DIR/" + a.shape + "-" + a.dtype + ".gguf)"
        : "memra-synth --shape " + a.shape + " --dtype " + a.dtype + " --seed " + a.seed + " -o MODEL.gguf";
    std::fprintf(f, "\"synth\": {\"generator\": \"%s\", \"shape\": \"%s\", \"dtype\": \"%s\", "
                    "\"seed\": %s, \"command\": \"%s\", \"sha256\": \"%s\", \"fnv1a64\": \"%016llx\"},\n",
                 a.generator.c_str(), a.shape.c_str(), a.dtype.c_str(),
                 a.seed.empty() ? "null" : a.seed.c_str(), command.c_str(), a.sha256.c_str(),
                 (unsigned long long) fnv1a64(a.model));
    std::fprintf(f, "\"settings\": {\"threads\": %d, \"n_ctx\": %d, \"tokens_per_decode\": 1, "
                    "\"kv_cache\": \"f32\", \"flash_attn\": false, \"weight_repacking\": false},\n",
                 a.threads, a.ctx);
    std::fprintf(f, "\"architecture\": \"%s\",\n\"n_vocab\": %d,\n\"n_expert_used\": %d,\n", arch,
                 n_vocab, moe.n_used);
    std::fprintf(f, "\"prompt\": ");
    put_ints(f, a.prompt);
    std::fprintf(f, ",\n\"steps\": [\n");

    // step i feeds token i of prompt + generated and yields the logits for position i + 1
    std::vector<llama_token> fed = a.prompt;
    std::vector<llama_token> generated;
    const int n_steps = (int) a.prompt.size() + a.generate - 1;
    for (int step = 0; step < n_steps; step++) {
        llama_token tok = fed[step];
        moe.topk.clear();
        moe.weights.clear();
        if (llama_decode(ctx, llama_batch_get_one(&tok, 1)) != 0) {
            die("llama_decode failed at step " + std::to_string(step));
        }
        const float * logits = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int i = 1; i < n_vocab; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        if (step + 1 >= (int) a.prompt.size()) {
            generated.push_back(best);
            fed.push_back(best);
        }
        std::fprintf(f, "{\"pos\": %d, \"token\": %d, \"argmax\": %d", step, tok, best);
        if (moe.n_used > 0) {
            std::fprintf(f, ",\n \"experts\": {");
            bool first = true;
            for (const auto & [layer, ids] : moe.topk) {
                std::fprintf(f, "%s\"%d\": ", first ? "" : ", ", layer);
                put_ints(f, ids);
                first = false;
            }
            std::fprintf(f, "},\n \"expert_probs\": {");
            first = true;
            for (const auto & [layer, w] : moe.weights) {
                std::fprintf(f, "%s\"%d\": ", first ? "" : ", ", layer);
                put_floats(f, w.data(), (int) w.size());
                first = false;
            }
            std::fprintf(f, "}");
        }
        std::fprintf(f, ",\n \"logits\": ");
        put_floats(f, logits, n_vocab);
        std::fprintf(f, "}%s\n", step + 1 < n_steps ? "," : "");
    }
    std::fprintf(f, "],\n\"generated\": ");
    put_ints(f, generated);
    std::fprintf(f, "\n}\n");
    std::fclose(f);

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
