// Greedy reference generator: prints JSON with prompt ids, generated ids, pieces and top-5 logits per step.
#include "llama.h"
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <fstream>
#include <sstream>
#include <algorithm>
static std::string jesc(const std::string &s){std::string o;for(unsigned char c:s){switch(c){case '"':o+="\\\"";break;case '\\':o+="\\\\";break;case '\n':o+="\\n";break;case '\t':o+="\\t";break;case '\r':o+="\\r";break;default: if(c<0x20){char b[8];snprintf(b,8,"\\u%04x",c);o+=b;} else o+=c;}}return o;}
static std::string piece(const llama_vocab*v,llama_token t){char buf[256];int n=llama_token_to_piece(v,t,buf,sizeof(buf),0,true);return std::string(buf,n<0?0:n);}
int main(int argc,char**argv){
  if(argc<4){fprintf(stderr,"usage: %s model.gguf prompt_file n_predict [threads]\n",argv[0]);return 1;}
  std::ifstream f(argv[2],std::ios::binary);std::stringstream ss;ss<<f.rdbuf();std::string prompt=ss.str();
  int n_predict=atoi(argv[3]);int nth=argc>4?atoi(argv[4]):2;
  llama_log_set([](ggml_log_level,const char*,void*){},nullptr);
  ggml_backend_load_all();
  auto mp=llama_model_default_params();
  llama_model*model=llama_model_load_from_file(argv[1],mp); if(!model) return 1;
  const llama_vocab*vocab=llama_model_get_vocab(model);
  int n=-llama_tokenize(vocab,prompt.c_str(),prompt.size(),NULL,0,true,true);
  std::vector<llama_token> toks(n);
  llama_tokenize(vocab,prompt.c_str(),prompt.size(),toks.data(),toks.size(),true,true);
  auto cp=llama_context_default_params(); cp.n_ctx=n+n_predict+8; cp.n_batch=std::max(n,1); cp.n_threads=nth; cp.n_threads_batch=nth;
  llama_context*ctx=llama_init_from_model(model,cp);
  const int nv=llama_vocab_n_tokens(vocab);
  printf("{\"prompt\":\"%s\",\"prompt_ids\":[",jesc(prompt).c_str());
  for(size_t i=0;i<toks.size();i++)printf("%s%d",i?",":"",toks[i]);
  printf("],\"steps\":[");
  llama_batch b=llama_batch_get_one(toks.data(),toks.size());
  std::vector<llama_token> gen; std::string text; bool eog=false; llama_token cur;
  for(int s=0;s<n_predict;s++){
    if(llama_decode(ctx,b)){fprintf(stderr,"decode failed\n");return 1;}
    float*lg=llama_get_logits_ith(ctx,-1);
    std::vector<int> idx(nv);for(int i=0;i<nv;i++)idx[i]=i;
    std::partial_sort(idx.begin(),idx.begin()+5,idx.end(),[&](int a,int c){return lg[a]>lg[c]||(lg[a]==lg[c]&&a<c);});
    cur=idx[0];
    printf("%s{\"id\":%d,\"piece\":\"%s\",\"top5\":[",s?",":"",cur,jesc(piece(vocab,cur)).c_str());
    for(int k=0;k<5;k++)printf("%s[%d,%.4f]",k?",":"",idx[k],lg[idx[k]]);
    printf("]}");
    gen.push_back(cur);
    if(llama_vocab_is_eog(vocab,cur)){eog=true;break;}
    text+=piece(vocab,cur);
    b=llama_batch_get_one(&cur,1);
  }
  printf("],\"generated_ids\":[");for(size_t i=0;i<gen.size();i++)printf("%s%d",i?",":"",gen[i]);
  printf("],\"generated_text\":\"%s\",\"stopped_at_eog\":%s}\n",jesc(text).c_str(),eog?"true":"false");
  llama_free(ctx);llama_model_free(model);return 0;}
