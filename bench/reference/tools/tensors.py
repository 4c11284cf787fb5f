import gguf, sys, re, collections
r = gguf.GGUFReader(sys.argv[1])
lines=[]
tot=0
pat=collections.OrderedDict()
for t in r.tensors:
    shape=[int(x) for x in t.shape]  # ggml order (ne0 first)
    lines.append(f"{t.name}\t{t.tensor_type.name}\t{'x'.join(map(str,shape))}\t{int(t.n_elements)}\t{int(t.n_bytes)}\t{int(t.data_offset)}")
    tot+=int(t.n_bytes)
    p=re.sub(r'^blk\.\d+\.', 'blk.N.', t.name)
    key=(p,t.tensor_type.name,'x'.join(map(str,shape)))
    pat[key]=pat.get(key,0)+1
with open(sys.argv[2],'w') as f:
    f.write("# SmolLM2-135M-Instruct.Q4_1.gguf tensor list (gguf-py %s GGUFReader)\n" % "0.19.0")
    f.write("# columns: name, ggml type, shape in ggml order (ne0 x ne1 ...; ne0 = contiguous dim), n_elements, n_bytes, data_offset (absolute file offset)\n")
    f.write("# tensor_count=%d total_tensor_bytes=%d\n" % (len(r.tensors), tot))
    f.write("\n".join(lines)+"\n")
print("tensors",len(r.tensors),"bytes",tot)
for (p,ty,sh),n in pat.items(): print(f"| `{p}` | {ty} | {sh} | {n} |")
