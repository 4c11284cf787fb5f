import gguf, sys, json
r = gguf.GGUFReader(sys.argv[1])
for k, f in r.fields.items():
    t = f.types
    if k in ("tokenizer.ggml.tokens","tokenizer.ggml.merges","tokenizer.ggml.token_type","tokenizer.ggml.scores"):
        print(k, "array len", len(f.data), "type", t)
        if k=="tokenizer.ggml.tokens":
            toks=[bytes(f.parts[i]).decode() for i in f.data]
            print("  first 20:", toks[:20]); print("  last 5:", toks[-5:])
        if k=="tokenizer.ggml.token_type":
            vals=[int(f.parts[i][0]) for i in f.data]
            from collections import Counter; print("  counts", Counter(vals))
        if k=="tokenizer.ggml.merges":
            print("  first 5:", [bytes(f.parts[i]).decode() for i in f.data[:5]])
        continue
    print(k, repr(f.contents()))
