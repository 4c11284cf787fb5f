import re, json
out=open("/tmp/ref/ppl.out").read(); err=open("/tmp/ref/ppl.err").read()
vals=[float(v) for _,v in re.findall(r"\[(\d+)\]([0-9.]+)",out)]
m=re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)",err)
doc={"model":"SmolLM2-135M-Instruct.Q4_1.gguf","model_sha256":"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
"llama_cpp_commit":"c392e5094deaf2d1a7c18683214f007fad3fe42b","llama_cpp_build":"b4748 (c392e5094)",
"command":"llama-perplexity -m models/SmolLM2-135M-Instruct.Q4_1.gguf -f testdata/perplexity.txt -c 512 -b 512 -t 2",
"text_file":"testdata/perplexity.txt","text_source":"/usr/share/common-licenses/GPL-3 (Debian base-files), GNU GPL v3 text; verbatim copying permitted",
"text_sha256":"3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986","text_bytes":35149,
"n_tokens":7639,"n_ctx":512,"n_batch":512,"n_chunks":14,"tokens_used":14*512,"scored_per_chunk":255,"scored_total":14*255,
"method":"Text tokenized once as a whole (add_special=true, parse_special=false; add_bos_token=false so no BOS anywhere). n_chunks = floor(n_tokens / n_ctx) = 14; chunk i = tokens[i*512:(i+1)*512], evaluated from an empty KV cache. Because add_bos_token=false the first token of each chunk is NOT replaced by BOS (llama.cpp replaces tokens[chunk_start] with BOS only when add_bos is true). Logits at positions first=n_ctx/2=256 .. 510 score tokens 257 .. 511 of the chunk (255 per chunk). NLL = -log softmax(logits)[next] in double; running PPL after chunk k = exp(sum NLL / count). Final ± = ppl * sqrt((mean(nll^2) - mean(nll)^2) / (count-1)).",
"running_ppl":vals,"final_ppl":float(m.group(1)),"final_ppl_pm":float(m.group(2))}
assert len(vals)==14
json.dump(doc,open("/work/main/testdata/perplexity.json","w"),indent=1)
print(vals, m.groups())
