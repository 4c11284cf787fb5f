import json, subprocess, os, tempfile, gguf, datetime
M="/work/main/models/SmolLM2-135M-Instruct.Q4_1.gguf"
TOK="/work/llamacpp/build/bin/llama-tokenize"
r=gguf.GGUFReader(M)
f=r.fields["tokenizer.ggml.tokens"]; vocab=[bytes(f.parts[i]).decode() for i in f.data]
prompts=[
 ("capital","The capital of France is"),
 ("hello","Hello, world!"),
 ("latin1_accents","Héllo café naïve résumé — “quoted” façade"),
 ("cjk","中文测试：你好，世界。"),
 ("emoji","Emoji: 🦀🚀 👩‍💻 ok 👍🏽"),
 ("numbers","12345 67.89 1000000 3.14159 -42 2024-01-01"),
 ("code","def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n"),
 ("whitespace","multiple   spaces\t\ttabs  and\n\n\nnewlines   "),
 ("leading_space"," leading space and trailing space "),
 ("contractions","Don't you're I'll we've IT'S HELLO hello HeLLo"),
 ("chatml_special","<|im_start|>user\nHi<|im_end|>\n"),
 ("empty",""),
]
def run(text, *flags):
    with tempfile.NamedTemporaryFile("wb", delete=False) as tf:
        tf.write(text.encode()); p=tf.name
    out=subprocess.run([TOK,"-m",M,"-f",p,"--no-escape","--ids","--log-disable",*flags],capture_output=True,text=True)
    os.unlink(p)
    assert out.returncode==0, out.stderr
    line=[l for l in out.stdout.splitlines() if l.startswith("[")][-1]
    return json.loads(line)
cases=[]
for name,text in prompts:
    d=run(text); nb=run(text,"--no-bos"); nps=run(text,"--no-parse-special")
    c={"name":name,"text":text,"ids":d,"ids_no_bos":nb,"tokens":[vocab[i] for i in d]}
    if nps!=d:
        c["ids_no_parse_special"]=nps; c["tokens_no_parse_special"]=[vocab[i] for i in nps]
    cases.append(c)
    print(name, d, "" if nps==d else f"nps={nps}")
doc={
 "model":"SmolLM2-135M-Instruct.Q4_1.gguf",
 "model_sha256":"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
 "generator":"llama.cpp llama-tokenize (commit c392e5094deaf2d1a7c18683214f007fad3fe42b, b4747-1)",
 "command":"llama-tokenize -m MODEL -f <file with exact UTF-8 text> --no-escape --ids --log-disable [--no-bos] [--no-parse-special]",
 "notes":[
  "tokenizer.ggml.model=gpt2 (byte-level BPE), tokenizer.ggml.pre=smollm, add_bos_token=false, add_space_prefix=false.",
  "'ids' = llama-tokenize default = what llama.cpp feeds the model: special tokens parsed, BOS added only if add_bos_token says so (it is false, so no BOS). bos_token_id=1 (<|im_start|>), eos_token_id=2 (<|im_end|>).",
  "'ids_no_bos' = with --no-bos; identical to 'ids' for this model.",
  "'ids_no_parse_special' present only where it differs from 'ids': control tokens treated as plain text.",
  "'tokens' = raw vocab strings (GPT-2 byte-to-unicode form, e.g. \u0120 = space) of 'ids'."
 ],
 "cases":cases}
json.dump(doc,open("/work/main/testdata/tokenize.json","w"),ensure_ascii=False,indent=1)
