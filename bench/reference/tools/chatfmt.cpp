// Prints llama_chat_apply_template(model's built-in template, messages, add_ass=true) — the non-jinja path llama-cli uses by default.
#include "llama.h"
#include <cstdio>
#include <string>
#include <vector>
int main(int argc,char**argv){
  llama_log_set([](ggml_log_level,const char*,void*){},nullptr);
  ggml_backend_load_all();
  llama_model*model=llama_model_load_from_file(argv[1],llama_model_default_params());
  const char*tmpl=llama_model_chat_template(model,nullptr);
  std::vector<llama_chat_message> msgs;
  for(int i=2;i+1<argc;i+=2) msgs.push_back({argv[i],argv[i+1]});
  std::vector<char> buf(65536);
  int n=llama_chat_apply_template(tmpl,msgs.data(),msgs.size(),true,buf.data(),buf.size());
  if(n<0){fprintf(stderr,"template failed\n");return 1;}
  fwrite(buf.data(),1,n,stdout);
  llama_model_free(model);return 0;}
