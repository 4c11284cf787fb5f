import json, subprocess, tempfile, os, jinja2, gguf
M="/work/main/models/SmolLM2-135M-Instruct.Q4_1.gguf"
G="/work/llamacpp-ref/greedy"; CF="/work/llamacpp-ref/chatfmt"
COMMIT="c392e5094deaf2d1a7c18683214f007fad3fe42b"
def greedy(text,n):
    with tempfile.NamedTemporaryFile("wb",delete=False) as tf: tf.write(text.encode()); p=tf.name
    out=subprocess.run([G,M,p,str(n),"2"],capture_output=True,text=True,check=True); os.unlink(p)
    return json.loads(out.stdout)
def cli(text,n):
    out=subprocess.run(["/work/llamacpp/build/bin/llama-cli","-m",M,"-p",text,"-n",str(n),"--temp","0","--top-k","1","-s","42","-t","2","-no-cnv","--no-display-prompt"],capture_output=True,text=True,stdin=subprocess.DEVNULL,timeout=120)
    return out.stdout
prompts=["The capital of France is","Once upon a time,","def fibonacci(n):\n","The quick brown fox","1, 2, 3, 4, 5,","Water boils at a temperature of"]
cases=[]
for p in prompts:
    d=greedy(p,32)
    c=cli(p,32)
    d["llama_cli_text_matches"]= (c.rstrip("\n")==d["generated_text"].rstrip("\n")) or c.startswith(d["generated_text"])
    if not d["llama_cli_text_matches"]: print("MISMATCH",repr(p),repr(c),repr(d["generated_text"]))
    cases.append(d); print(repr(p),"->",repr(d["generated_text"]))
json.dump({"model":"SmolLM2-135M-Instruct.Q4_1.gguf","model_sha256":"b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
 "llama_cpp_commit":COMMIT,"n_predict":32,"threads":2,
 "method":"greedy argmax over last-position logits (ties -> lowest id), raw completion, no chat template. Prompt tokenized with llama_tokenize(add_special=true, parse_special=true) -> no BOS because add_bos_token=false. Prompt decoded as one batch, then one token per decode. Generation stops early only on an end-of-generation token (the EOG id is included in generated_ids but not in generated_text). Tool: small C++ program against libllama (greedy.cpp, described in bench/reference/llamacpp-cpu.md); text cross-checked against `llama-cli --temp 0 --top-k 1 -no-cnv -n 32 -t 2` and `llama-simple -n 32`.",
 "top5_note":"steps[i].top5 = [[token_id, logit], ...] for the 5 highest logits at step i (raw logits, F32, CPU backend, 4 decimals) — useful for tolerance checks.",
 "cases":cases},open("/work/main/testdata/greedy.json","w"),ensure_ascii=False,indent=1)

# chat
r=gguf.GGUFReader(M); tmpl=r.fields["tokenizer.chat_template"].contents()
env=jinja2.Environment(); T=env.from_string(tmpl)
def render(msgs): return T.render(messages=msgs,add_generation_prompt=True,bos_token="<|im_start|>",eos_token="<|im_end|>")
def builtin(msgs):
    args=[CF,M]
    for m in msgs: args+= [m["role"],m["content"]]
    return subprocess.run(args,capture_output=True,text=True,check=True).stdout
chat={"model":"SmolLM2-135M-Instruct.Q4_1.gguf","llama_cpp_commit":COMMIT,"chat_template":tmpl,
 "notes":["'jinja' = the GGUF's tokenizer.chat_template rendered with Python jinja2 (add_generation_prompt=True); matches HF transformers and `llama-cli --jinja`. It injects a default system prompt when the first message is not a system message.",
          "'builtin' = llama_chat_apply_template() with the model's template, which llama.cpp (without --jinja) detects as 'chatml' and formats WITHOUT the default system prompt; this is what plain `llama-cli -cnv` feeds the model at this commit.",
          "Replies: greedy, up to 128 tokens, stop at EOG (<|im_end|> id 2 / <|endoftext|> id 0); prompt tokenized with special tokens parsed, no BOS."],
 "conversations":[]}
q1="What is the capital of France?"
for style,fmt in (("jinja",render),("builtin",builtin)):
    m1=[{"role":"user","content":q1}]
    p1=fmt(m1); r1=greedy(p1,128)
    m2=m1+[{"role":"assistant","content":r1["generated_text"]},{"role":"user","content":"And what is its population?"}]
    p2=fmt(m2); r2=greedy(p2,128)
    for name,msgs,p,rr in (("single_turn",m1,p1,r1),("two_turn",m2,p2,r2)):
        chat["conversations"].append({"name":name,"formatter":style,"messages":msgs,"formatted_prompt":p,"prompt_ids":rr["prompt_ids"],"reply_ids":rr["generated_ids"],"reply_text":rr["generated_text"],"stopped_at_eog":rr["stopped_at_eog"]})
        print(style,name,repr(p)); print("  ->",repr(rr["generated_text"]),rr["stopped_at_eog"])
json.dump(chat,open("/work/main/testdata/chat.json","w"),ensure_ascii=False,indent=1)
